//! Every way a command can fail, and the one place where a failure becomes
//! a SCSI status and sense data: [`ScsiError::status_and_sense`].

use crate::sense::{FieldPointer, Sense, SenseKey, Status};
use crate::ua::UnitAttention;

/// A command that did not complete with GOOD status.
///
/// The daemon turns any of these into what goes on the wire with
/// [`ScsiError::status_and_sense`] and nowhere else. Backstore failures are
/// reported through the medium variants, so a failed read or write is never
/// a silent success.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScsiError {
    /// The operation code is not supported (ILLEGAL REQUEST, INVALID COMMAND
    /// OPERATION CODE 20h/00h).
    #[error("invalid command operation code {opcode:#04x}")]
    InvalidOpcode {
        /// The rejected operation code.
        opcode: u8,
    },
    /// The CDB is shorter than its operation code requires (ILLEGAL REQUEST,
    /// INVALID FIELD IN CDB).
    #[error("CDB of {len} bytes is shorter than the {required} its operation code needs")]
    CdbTooShort {
        /// Bytes received.
        len: usize,
        /// Bytes the operation code needs.
        required: usize,
    },
    /// A CDB field is invalid or a reserved bit is set (ILLEGAL REQUEST,
    /// INVALID FIELD IN CDB 24h/00h).
    #[error("invalid field in CDB")]
    InvalidFieldInCdb {
        /// The offending field, when known.
        field: Option<FieldPointer>,
    },
    /// A parameter list field is invalid (ILLEGAL REQUEST, INVALID FIELD IN
    /// PARAMETER LIST 26h/00h).
    #[error("invalid field in parameter list")]
    InvalidFieldInParameterList {
        /// The offending field, when known.
        field: Option<FieldPointer>,
    },
    /// The parameter list is too short or its length is wrong (ILLEGAL
    /// REQUEST, PARAMETER LIST LENGTH ERROR 1Ah/00h).
    #[error("parameter list length error")]
    ParameterListLength,
    /// The data-out buffer does not have the length the CDB implies
    /// (ILLEGAL REQUEST, INVALID FIELD IN CDB, as Linux TCM answers).
    #[error("data-out length {actual} does not match the expected {expected}")]
    DataLengthMismatch {
        /// Bytes the CDB implies.
        expected: u64,
        /// Bytes the initiator sent.
        actual: u64,
    },
    /// The LBA range goes past the last block (ILLEGAL REQUEST, LOGICAL BLOCK
    /// ADDRESS OUT OF RANGE 21h/00h).
    #[error("LBA {lba} + {blocks} blocks is out of range")]
    LbaOutOfRange {
        /// First LBA of the request.
        lba: u64,
        /// Number of blocks requested.
        blocks: u64,
    },
    /// No logical unit at this address (ILLEGAL REQUEST, LOGICAL UNIT NOT
    /// SUPPORTED 25h/00h).
    #[error("logical unit not supported")]
    LogicalUnitNotSupported,
    /// A write to a read-only logical unit (DATA PROTECT, WRITE PROTECTED
    /// 27h/00h).
    #[error("write protected")]
    WriteProtected,
    /// Saved mode parameters were asked for (ILLEGAL REQUEST, SAVING
    /// PARAMETERS NOT SUPPORTED 39h/00h).
    #[error("saving parameters not supported")]
    SavingParametersNotSupported,
    /// PERSISTENT RESERVE OUT RELEASE by the holder named another type or
    /// scope (ILLEGAL REQUEST, INVALID RELEASE OF PERSISTENT RESERVATION
    /// 26h/04h).
    #[error("invalid release of persistent reservation")]
    InvalidRelease,
    /// No room for another registration (ILLEGAL REQUEST, INSUFFICIENT
    /// REGISTRATION RESOURCES 55h/04h).
    #[error("insufficient registration resources")]
    InsufficientRegistrationResources,
    /// The command conflicts with a persistent reservation (status
    /// RESERVATION CONFLICT, no sense data).
    #[error("reservation conflict")]
    ReservationConflict,
    /// A unit attention condition is reported to this I_T nexus (UNIT
    /// ATTENTION with the condition's ASC/ASCQ).
    #[error("unit attention: {0:?}")]
    UnitAttention(UnitAttention),
    /// The backstore failed to read (MEDIUM ERROR, UNRECOVERED READ ERROR
    /// 11h/00h).
    #[error("unrecovered read error")]
    UnrecoveredReadError {
        /// First LBA that failed, when known.
        lba: Option<u64>,
    },
    /// The backstore failed to write (MEDIUM ERROR, WRITE ERROR 0Ch/00h).
    #[error("write error")]
    WriteError {
        /// First LBA that failed, when known.
        lba: Option<u64>,
    },
    /// The target itself failed (HARDWARE ERROR, INTERNAL TARGET FAILURE
    /// 44h/00h).
    #[error("internal target failure")]
    InternalTargetFailure,
    /// The logical unit is busy (status BUSY, no sense data).
    #[error("busy")]
    Busy,
    /// Too many commands are queued (status TASK SET FULL, no sense data).
    #[error("task set full")]
    TaskSetFull,
}

impl ScsiError {
    /// INVALID FIELD IN CDB pointing at `byte` (and `bit`) of the CDB.
    pub const fn cdb_field(byte: u16, bit: Option<u8>) -> Self {
        Self::InvalidFieldInCdb {
            field: Some(FieldPointer::cdb(byte, bit)),
        }
    }

    /// INVALID FIELD IN PARAMETER LIST pointing at `byte` (and `bit`) of the
    /// parameter list.
    pub const fn parameter_field(byte: u16, bit: Option<u8>) -> Self {
        Self::InvalidFieldInParameterList {
            field: Some(FieldPointer::parameter(byte, bit)),
        }
    }

    /// The status to return and the sense data that go with it (`None` for
    /// the statuses that carry none). This is the only mapping from errors
    /// to the wire.
    pub fn status_and_sense(&self) -> (Status, Option<Sense>) {
        use SenseKey::{DataProtect, HardwareError, IllegalRequest, MediumError};
        let check = |s: Sense| (Status::CheckCondition, Some(s));
        let illegal = |asc, ascq, field: Option<FieldPointer>| {
            let s = Sense::new(IllegalRequest, asc, ascq);
            check(match field {
                Some(f) => s.with_field(f),
                None => s,
            })
        };
        let medium = |asc, lba: Option<u64>| {
            let s = Sense::new(MediumError, asc, 0x00);
            check(match lba {
                Some(l) => s.with_information(l),
                None => s,
            })
        };
        match *self {
            Self::InvalidOpcode { .. } => illegal(0x20, 0x00, None),
            Self::CdbTooShort { .. } | Self::DataLengthMismatch { .. } => illegal(0x24, 0x00, None),
            Self::InvalidFieldInCdb { field } => illegal(0x24, 0x00, field),
            Self::InvalidFieldInParameterList { field } => illegal(0x26, 0x00, field),
            Self::ParameterListLength => illegal(0x1a, 0x00, None),
            Self::LbaOutOfRange { .. } => illegal(0x21, 0x00, None),
            Self::LogicalUnitNotSupported => illegal(0x25, 0x00, None),
            Self::SavingParametersNotSupported => illegal(0x39, 0x00, None),
            Self::InvalidRelease => illegal(0x26, 0x04, None),
            Self::InsufficientRegistrationResources => illegal(0x55, 0x04, None),
            Self::WriteProtected => check(Sense::new(DataProtect, 0x27, 0x00)),
            Self::UnitAttention(ua) => check(ua.sense()),
            Self::UnrecoveredReadError { lba } => medium(0x11, lba),
            Self::WriteError { lba } => medium(0x0c, lba),
            Self::InternalTargetFailure => check(Sense::new(HardwareError, 0x44, 0x00)),
            Self::ReservationConflict => (Status::ReservationConflict, None),
            Self::Busy => (Status::Busy, None),
            Self::TaskSetFull => (Status::TaskSetFull, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_asc(e: ScsiError) -> (Status, Option<(SenseKey, u8, u8)>) {
        let (st, s) = e.status_and_sense();
        (st, s.map(|s| (s.key, s.asc, s.ascq)))
    }

    #[test]
    fn mapping_table() {
        use SenseKey::*;
        let cc = Status::CheckCondition;
        let cases = [
            (
                ScsiError::InvalidOpcode { opcode: 0xff },
                IllegalRequest,
                0x20,
                0x00,
            ),
            (ScsiError::cdb_field(1, None), IllegalRequest, 0x24, 0x00),
            (
                ScsiError::parameter_field(0, None),
                IllegalRequest,
                0x26,
                0x00,
            ),
            (ScsiError::ParameterListLength, IllegalRequest, 0x1a, 0x00),
            (
                ScsiError::LbaOutOfRange { lba: 1, blocks: 1 },
                IllegalRequest,
                0x21,
                0x00,
            ),
            (
                ScsiError::LogicalUnitNotSupported,
                IllegalRequest,
                0x25,
                0x00,
            ),
            (ScsiError::WriteProtected, DataProtect, 0x27, 0x00),
            (
                ScsiError::SavingParametersNotSupported,
                IllegalRequest,
                0x39,
                0x00,
            ),
            (ScsiError::InvalidRelease, IllegalRequest, 0x26, 0x04),
            (
                ScsiError::UnrecoveredReadError { lba: None },
                MediumError,
                0x11,
                0x00,
            ),
            (ScsiError::WriteError { lba: None }, MediumError, 0x0c, 0x00),
            (ScsiError::InternalTargetFailure, HardwareError, 0x44, 0x00),
            (
                ScsiError::UnitAttention(crate::ua::UnitAttention::CapacityChanged),
                UnitAttention,
                0x2a,
                0x09,
            ),
        ];
        for (e, key, asc, ascq) in cases {
            assert_eq!(key_asc(e), (cc, Some((key, asc, ascq))), "{e:?}");
        }
    }

    #[test]
    fn statuses_without_sense() {
        assert_eq!(
            ScsiError::ReservationConflict.status_and_sense(),
            (Status::ReservationConflict, None)
        );
        assert_eq!(ScsiError::Busy.status_and_sense(), (Status::Busy, None));
        assert_eq!(
            ScsiError::TaskSetFull.status_and_sense(),
            (Status::TaskSetFull, None)
        );
    }

    #[test]
    fn medium_error_carries_the_lba() {
        let (_, s) = ScsiError::WriteError { lba: Some(77) }.status_and_sense();
        assert_eq!(s.and_then(|s| s.information), Some(77));
    }

    #[test]
    fn field_pointer_is_kept() {
        let (_, s) = ScsiError::cdb_field(9, Some(2)).status_and_sense();
        assert_eq!(s.and_then(|s| s.field), Some(FieldPointer::cdb(9, Some(2))));
    }
}
