//! SCSI target emulation for sqcq, in the spirit of Linux TCM: the SPC-4 /
//! SBC-3 subset that Linux sd, sg3_utils and fio use. Pure logic: no I/O,
//! no threads, no unsafe.
//!
//! The daemon calls [`LogicalUnit::execute`] once per command. Medium
//! access commands come back as a [`MediumOp`] that the worker runs against
//! the backstore, zero-copy between guest buffers and the backstore; every
//! other command builds its response in a caller-provided scratch buffer.
//! Failures are [`ScsiError`]s, turned into status and sense data in one
//! place, [`ScsiError::status_and_sense`].
//!
//! Module map: `cdb` (parsing) over `usage` (the table of supported
//! commands and their CDB usage masks); `sense` and `error`; `lun` (the
//! logical unit and the dispatch) over everything else; `completion`
//! (what a command comes back with); `medium` and `unmap` (the medium
//! path); `inquiry`, `vpd`, `capacity`, `mode`, `rsoc`, `alua` (response
//! data, each a function of the unit's configuration and the state it is
//! given, none knowing the unit itself); `pr` (persistent reservations);
//! `ua` (unit attentions); `luns` (REPORT LUNS and absent LUNs); `config`.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod alua;
mod capacity;
mod cdb;
mod completion;
mod config;
mod error;
mod inquiry;
mod lun;
mod luns;
mod medium;
mod mode;
mod pr;
mod resp;
mod rsoc;
mod sense;
mod ua;
mod unmap;
mod usage;
mod vpd;

#[cfg(test)]
mod test_util;

pub use cdb::{Command, PageControl};
pub use completion::{Completion, MediumOp, ReportLunsRequest};
pub use config::{ConfigError, LuConfig, Provisioning};
pub use error::ScsiError;
pub use inquiry::VENDOR;
pub use lun::LogicalUnit;
pub use luns::{MAX_LUN, encode_lun, execute_absent, report_luns};
pub use pr::{MAX_REGISTRANTS, PrInAction, PrOutAction, PrType};
pub use sense::{
    FIXED_SENSE_LEN, FieldPointer, MAX_DESCRIPTOR_SENSE_LEN, Sense, SenseFormat, SenseKey, Status,
};
pub use ua::{NexusId, UnitAttention};
pub use unmap::{UnmapList, UnmapRange};

/// Scratch buffer size for `data_in` that holds every response in full:
/// the largest are REPORT SUPPORTED OPERATION CODES with timeouts (under
/// 1 KiB) and READ KEYS with [`MAX_REGISTRANTS`] keys (1032 bytes). A
/// smaller buffer is safe; responses are then truncated.
pub const DATA_IN_LEN: usize = 4096;

// Every response fits DATA_IN_LEN.
const _: () = assert!(rsoc::MAX_RESPONSE_LEN <= DATA_IN_LEN);
const _: () = assert!(8 + 8 * MAX_REGISTRANTS <= DATA_IN_LEN);

/// Whether the command carries parameter data that the worker must copy
/// into `data_out` before [`LogicalUnit::execute`]: MODE SELECT, PERSISTENT
/// RESERVE OUT, UNMAP and WRITE SAME (its one block). At most
/// [`LogicalUnit::max_data_out_len`] bytes are needed.
pub fn takes_parameter_data(cdb: &[u8]) -> bool {
    use usage::op;
    matches!(
        cdb.first(),
        Some(
            &(op::MODE_SELECT_6
                | op::MODE_SELECT_10
                | op::PERSISTENT_RESERVE_OUT
                | op::UNMAP
                | op::WRITE_SAME_10
                | op::WRITE_SAME_16)
        )
    )
}
