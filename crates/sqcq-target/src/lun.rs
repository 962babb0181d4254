//! The 8-byte virtio-scsi LUN field (virtio 5.6.6.1).
//!
//! Byte 0 is 1, byte 1 the target, bytes 2-3 the LUN in SAM single-level
//! format (flat space addressing `0x40 | hi, lo`, or peripheral addressing
//! `0, lo`), bytes 4-7 zero. Like Linux's vhost-scsi, the 14-bit LUN is
//! `((b2 << 8) | b3) & 0x3fff`.

/// Highest LUN number a single-level LUN can carry.
pub const MAX_LUN: u16 = 0x3fff;

/// What a LUN field addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LunAddress {
    /// A target and a LUN on it.
    Lun {
        /// Target number.
        target: u8,
        /// Logical unit number.
        lun: u16,
    },
    /// The field is not in the virtio-scsi format (byte 0 is not 1): it
    /// addresses no target.
    Invalid,
}

impl LunAddress {
    /// Decodes the LUN field.
    pub fn decode(b: &[u8; 8]) -> Self {
        if b[0] != 1 {
            return LunAddress::Invalid;
        }
        LunAddress::Lun {
            target: b[1],
            lun: u16::from_be_bytes([b[2], b[3]]) & MAX_LUN,
        }
    }

    /// Encodes the field with flat space addressing, as Linux does.
    pub fn encode(&self) -> [u8; 8] {
        match *self {
            LunAddress::Lun { target, lun } => {
                let [hi, lo] = (lun & MAX_LUN).to_be_bytes();
                [1, target, 0x40 | hi, lo, 0, 0, 0, 0]
            }
            LunAddress::Invalid => [0; 8],
        }
    }

    /// Encodes the field of an event (virtio 5.6.6.3): LUNs below 256
    /// with peripheral addressing, as REPORT LUNS lists them, like QEMU and
    /// Linux's vhost-scsi. Linux's driver takes `(lun[2] << 8) | lun[3]`
    /// unmasked as the LUN to scan or remove, so flat addressing here would
    /// name LUN 0x4001 instead of 1.
    pub fn encode_event(&self) -> [u8; 8] {
        match *self {
            LunAddress::Lun { target, lun } if lun < 0x100 => {
                [1, target, 0, lun.to_be_bytes()[1], 0, 0, 0, 0]
            }
            _ => self.encode(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_and_peripheral_addressing_decode_alike() {
        assert_eq!(
            LunAddress::decode(&[1, 0, 0x40, 7, 0, 0, 0, 0]),
            LunAddress::Lun { target: 0, lun: 7 }
        );
        assert_eq!(
            LunAddress::decode(&[1, 3, 0, 7, 0, 0, 0, 0]),
            LunAddress::Lun { target: 3, lun: 7 }
        );
        assert_eq!(
            LunAddress::decode(&[1, 0, 0x7f, 0xff, 0, 0, 0, 0]),
            LunAddress::Lun {
                target: 0,
                lun: 0x3fff
            }
        );
    }

    #[test]
    fn wrong_first_byte_is_invalid() {
        assert_eq!(LunAddress::decode(&[0; 8]), LunAddress::Invalid);
        assert_eq!(
            LunAddress::decode(&[2, 0, 0x40, 0, 0, 0, 0, 0]),
            LunAddress::Invalid
        );
    }

    #[test]
    fn events_use_the_report_luns_form() {
        let a = |lun| LunAddress::Lun { target: 0, lun };
        assert_eq!(a(1).encode_event(), [1, 0, 0, 1, 0, 0, 0, 0]);
        assert_eq!(a(0x123).encode_event(), [1, 0, 0x41, 0x23, 0, 0, 0, 0]);
        assert_eq!(LunAddress::decode(&a(7).encode_event()), a(7));
    }

    #[test]
    fn encode_round_trips() {
        let a = LunAddress::Lun {
            target: 0,
            lun: 300,
        };
        assert_eq!(LunAddress::decode(&a.encode()), a);
    }
}
