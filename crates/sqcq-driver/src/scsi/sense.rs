//! Sense data (SPC-5 4.4), reduced to what a submitter acts on.

use std::fmt;

/// The sense key and additional sense code of a CHECK CONDITION.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    /// Sense key (4 bits).
    pub key: u8,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
}

/// SCSI status GOOD (SAM-5 5.3).
pub const STATUS_GOOD: u8 = 0x00;
/// SCSI status CHECK CONDITION.
pub const STATUS_CHECK_CONDITION: u8 = 0x02;

/// Sense key UNIT ATTENTION.
pub const UNIT_ATTENTION: u8 = 0x6;
/// Sense key NOT READY.
pub const NOT_READY: u8 = 0x2;

impl Sense {
    /// Parses fixed (0x70/0x71) or descriptor (0x72/0x73) format sense
    /// data; `None` when it is too short or of another format.
    pub fn parse(data: &[u8]) -> Option<Self> {
        let code = data.first()? & 0x7f;
        match code {
            0x70 | 0x71 => Some(Self {
                key: data.get(2)? & 0x0f,
                asc: *data.get(12).unwrap_or(&0),
                ascq: *data.get(13).unwrap_or(&0),
            }),
            0x72 | 0x73 => Some(Self {
                key: data.get(1)? & 0x0f,
                asc: *data.get(2).unwrap_or(&0),
                ascq: *data.get(3).unwrap_or(&0),
            }),
            _ => None,
        }
    }
}

impl fmt::Display for Sense {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sense key {:#x} asc/ascq {:#04x}/{:#04x}",
            self.key, self.asc, self.ascq
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_and_descriptor_formats() {
        let mut fixed = [0u8; 18];
        fixed[0] = 0xf0; // valid bit set
        fixed[2] = 0x06;
        fixed[12] = 0x29;
        fixed[13] = 0x01;
        assert_eq!(
            Sense::parse(&fixed),
            Some(Sense {
                key: UNIT_ATTENTION,
                asc: 0x29,
                ascq: 0x01
            })
        );
        assert_eq!(
            Sense::parse(&[0x72, 0x05, 0x24, 0x00]),
            Some(Sense {
                key: 5,
                asc: 0x24,
                ascq: 0
            })
        );
        assert_eq!(Sense::parse(&[]), None);
        assert_eq!(Sense::parse(&[0x70, 0]), None);
        assert_eq!(Sense::parse(&[0x12, 0, 0]), None);
    }
}
