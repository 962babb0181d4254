//! Status codes and sense data (SAM-5, SPC-4).
//!
//! [`Sense`] holds what a CHECK CONDITION reports; it encodes itself in the
//! fixed format (response code 0x70, SPC-4) or the descriptor format
//! (response code 0x72, SPC-4), byte-exact.

/// SCSI status codes (SAM-5) this target returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    /// The command completed successfully.
    Good = 0x00,
    /// The command failed; sense data say why.
    CheckCondition = 0x02,
    /// The logical unit is busy; the initiator should retry.
    Busy = 0x08,
    /// The command conflicts with a persistent reservation.
    ReservationConflict = 0x18,
    /// The task set is full; the initiator should retry later.
    TaskSetFull = 0x28,
}

impl Status {
    /// The status byte on the wire.
    pub const fn code(self) -> u8 {
        self as u8
    }
}

/// Sense keys (SPC-4) this target reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SenseKey {
    /// Nothing to report (REQUEST SENSE with nothing pending).
    NoSense = 0x0,
    /// The logical unit cannot be accessed right now.
    NotReady = 0x2,
    /// The medium (backstore) failed to read or write.
    MediumError = 0x3,
    /// The target itself failed.
    HardwareError = 0x4,
    /// The command or its parameter data was invalid.
    IllegalRequest = 0x5,
    /// Something changed that the initiator must be told about.
    UnitAttention = 0x6,
    /// The medium is write protected.
    DataProtect = 0x7,
    /// The command was aborted.
    AbortedCommand = 0xb,
}

impl SenseKey {
    /// The 4-bit sense key value.
    pub const fn code(self) -> u8 {
        self as u8
    }
}

/// Which format [`Sense::encode`] produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SenseFormat {
    /// Fixed format, response code 0x70, 18 bytes.
    Fixed,
    /// Descriptor format, response code 0x72.
    Descriptor,
}

/// A field pointer: the sense-key specific information of ILLEGAL REQUEST
/// (SPC-4) that names the offending byte and bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FieldPointer {
    /// True when the field is in the CDB (C/D = 1), false when it is in the
    /// parameter list.
    pub in_cdb: bool,
    /// Byte offset of the field.
    pub byte: u16,
    /// Bit within that byte (0-7, the most significant bit of the field),
    /// when known (BPV = 1).
    pub bit: Option<u8>,
}

/// The most significant set bit of a non-zero byte: the bit a field
/// pointer names when the set bits of a byte are wrong.
pub(crate) fn top_bit(b: u8) -> u8 {
    (0..8u8).rev().find(|i| b & (1 << i) != 0).unwrap_or(0)
}

impl FieldPointer {
    /// A pointer into the CDB.
    pub const fn cdb(byte: u16, bit: Option<u8>) -> Self {
        Self {
            in_cdb: true,
            byte,
            bit,
        }
    }

    /// A pointer into the parameter list.
    pub const fn parameter(byte: u16, bit: Option<u8>) -> Self {
        Self {
            in_cdb: false,
            byte,
            bit,
        }
    }

    /// The three sense-key specific bytes, SKSV set.
    pub const fn to_bytes(self) -> [u8; 3] {
        let mut b0 = 0x80;
        if self.in_cdb {
            b0 |= 0x40;
        }
        if let Some(bit) = self.bit {
            b0 |= 0x08 | (bit & 0x07);
        }
        let [hi, lo] = self.byte.to_be_bytes();
        [b0, hi, lo]
    }
}

/// Sense data for one failed command or one unit attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sense {
    /// The sense key.
    pub key: SenseKey,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
    /// The information field (e.g. the first failed LBA of a medium error).
    pub information: Option<u64>,
    /// The sense-key specific field pointer (ILLEGAL REQUEST only).
    pub field: Option<FieldPointer>,
}

/// Length of fixed-format sense data.
pub const FIXED_SENSE_LEN: usize = 18;
/// Longest descriptor-format sense data this crate produces: header (8),
/// information descriptor (12), sense-key specific descriptor (8).
pub const MAX_DESCRIPTOR_SENSE_LEN: usize = 28;

impl Sense {
    /// Sense data with only key, ASC and ASCQ.
    pub const fn new(key: SenseKey, asc: u8, ascq: u8) -> Self {
        Self {
            key,
            asc,
            ascq,
            information: None,
            field: None,
        }
    }

    /// The same sense data with a field pointer.
    pub const fn with_field(mut self, field: FieldPointer) -> Self {
        self.field = Some(field);
        self
    }

    /// The same sense data with an information field.
    pub const fn with_information(mut self, information: u64) -> Self {
        self.information = Some(information);
        self
    }

    /// NO SENSE, nothing to report.
    pub const NONE: Self = Self::new(SenseKey::NoSense, 0, 0);

    /// Fixed-format sense data (SPC-4). An information value that
    /// does not fit 32 bits is left out (VALID = 0), as the standard says.
    pub fn fixed(&self) -> [u8; FIXED_SENSE_LEN] {
        let mut b = [0u8; FIXED_SENSE_LEN];
        b[0] = 0x70;
        if let Some(info) = self.information.and_then(|i| u32::try_from(i).ok()) {
            b[0] |= 0x80;
            b[3..7].copy_from_slice(&info.to_be_bytes());
        }
        b[2] = self.key.code();
        b[7] = 10; // additional sense length: bytes 8..18
        b[12] = self.asc;
        b[13] = self.ascq;
        if let Some(field) = self.field {
            b[15..18].copy_from_slice(&field.to_bytes());
        }
        b
    }

    /// Descriptor-format sense data (SPC-4) and its length: an
    /// information descriptor (4.5.2.2) and a sense-key specific descriptor
    /// (4.5.2.4) follow the header when present.
    pub fn descriptor(&self) -> ([u8; MAX_DESCRIPTOR_SENSE_LEN], usize) {
        let mut b = [0u8; MAX_DESCRIPTOR_SENSE_LEN];
        b[0] = 0x72;
        b[1] = self.key.code();
        b[2] = self.asc;
        b[3] = self.ascq;
        let mut len = 8;
        if let Some(info) = self.information {
            b[len] = 0x00;
            b[len + 1] = 0x0a;
            b[len + 2] = 0x80;
            b[len + 4..len + 12].copy_from_slice(&info.to_be_bytes());
            len += 12;
        }
        if let Some(field) = self.field {
            b[len] = 0x02;
            b[len + 1] = 0x06;
            b[len + 4..len + 7].copy_from_slice(&field.to_bytes());
            len += 8;
        }
        // Additional sense length: the descriptors after the 8-byte header.
        b[7] = u8::try_from(len - 8).unwrap_or(u8::MAX);
        (b, len)
    }

    /// Writes the sense data in `format` into `out`, truncated to its
    /// length, and returns the number of bytes written.
    pub fn encode(&self, format: SenseFormat, out: &mut [u8]) -> usize {
        let fixed;
        let desc;
        let bytes: &[u8] = match format {
            SenseFormat::Fixed => {
                fixed = self.fixed();
                &fixed
            }
            SenseFormat::Descriptor => {
                desc = self.descriptor();
                desc.0.get(..desc.1).unwrap_or(&[])
            }
        };
        let n = bytes.len().min(out.len());
        out[..n].copy_from_slice(&bytes[..n]);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_bit_of_bytes() {
        assert_eq!(top_bit(0x01), 0);
        assert_eq!(top_bit(0x80), 7);
        assert_eq!(top_bit(0x24), 5);
    }

    #[test]
    fn fixed_invalid_field_in_cdb_without_pointer() {
        let s = Sense::new(SenseKey::IllegalRequest, 0x24, 0x00);
        assert_eq!(
            s.fixed(),
            [
                0x70, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x24, 0x00,
                0x00, 0x00, 0x00, 0x00
            ]
        );
    }

    #[test]
    fn fixed_invalid_field_in_cdb_with_bit_pointer() {
        // Byte 1, bit 4 of the CDB: SKSV | C/D | BPV | 4 = 0xcc, pointer 0x0001.
        let s = Sense::new(SenseKey::IllegalRequest, 0x24, 0x00)
            .with_field(FieldPointer::cdb(1, Some(4)));
        let b = s.fixed();
        assert_eq!(&b[12..18], &[0x24, 0x00, 0x00, 0xcc, 0x00, 0x01]);
    }

    #[test]
    fn fixed_parameter_pointer_has_cd_clear() {
        let s = Sense::new(SenseKey::IllegalRequest, 0x26, 0x00)
            .with_field(FieldPointer::parameter(0x0102, None));
        assert_eq!(&s.fixed()[15..18], &[0x80, 0x01, 0x02]);
    }

    #[test]
    fn fixed_information_sets_valid() {
        let s = Sense::new(SenseKey::MediumError, 0x11, 0x00).with_information(0x1234_5678);
        let b = s.fixed();
        assert_eq!(b[0], 0xf0);
        assert_eq!(b[2], 0x03);
        assert_eq!(&b[3..7], &[0x12, 0x34, 0x56, 0x78]);
    }

    #[test]
    fn fixed_information_too_large_is_not_valid() {
        let s = Sense::new(SenseKey::MediumError, 0x11, 0x00).with_information(1 << 40);
        let b = s.fixed();
        assert_eq!(b[0], 0x70);
        assert_eq!(&b[3..7], &[0, 0, 0, 0]);
    }

    #[test]
    fn descriptor_header_only() {
        let s = Sense::new(SenseKey::UnitAttention, 0x29, 0x00);
        let (b, len) = s.descriptor();
        assert_eq!(&b[..len], &[0x72, 0x06, 0x29, 0x00, 0, 0, 0, 0x00]);
    }

    #[test]
    fn descriptor_with_information_and_pointer() {
        let s = Sense::new(SenseKey::IllegalRequest, 0x24, 0x00)
            .with_information(0x0102_0304_0506_0708)
            .with_field(FieldPointer::cdb(2, Some(7)));
        let (b, len) = s.descriptor();
        assert_eq!(
            &b[..len],
            &[
                0x72, 0x05, 0x24, 0x00, 0, 0, 0, 20, // header, 20 bytes follow
                0x00, 0x0a, 0x80, 0x00, 1, 2, 3, 4, 5, 6, 7, 8, // information
                0x02, 0x06, 0x00, 0x00, 0xcf, 0x00, 0x02, 0x00, // sense-key specific
            ]
        );
    }

    #[test]
    fn encode_truncates_to_the_buffer() {
        let s = Sense::new(SenseKey::IllegalRequest, 0x20, 0x00);
        let mut out = [0xffu8; 8];
        assert_eq!(s.encode(SenseFormat::Fixed, &mut out), 8);
        assert_eq!(out, [0x70, 0, 0x05, 0, 0, 0, 0, 0x0a]);
        let mut big = [0u8; 96];
        assert_eq!(s.encode(SenseFormat::Fixed, &mut big), 18);
        assert_eq!(s.encode(SenseFormat::Descriptor, &mut big), 8);
        assert_eq!(&big[..4], &[0x72, 0x05, 0x20, 0x00]);
    }

    #[test]
    fn status_codes() {
        assert_eq!(Status::Good.code(), 0x00);
        assert_eq!(Status::CheckCondition.code(), 0x02);
        assert_eq!(Status::Busy.code(), 0x08);
        assert_eq!(Status::ReservationConflict.code(), 0x18);
        assert_eq!(Status::TaskSetFull.code(), 0x28);
    }
}
