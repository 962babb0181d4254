//! Shared helpers for the unit tests.

use crate::completion::Completion;
use crate::config::{LuConfig, Provisioning};
use crate::error::ScsiError;
use crate::lun::LogicalUnit;
use crate::ua::NexusId;

pub(crate) const A: NexusId = NexusId(1);
pub(crate) const B: NexusId = NexusId(2);

/// 1000 blocks of 512 bytes, 128-block transfers, thin provisioned.
pub(crate) fn config() -> LuConfig {
    let mut c = LuConfig::new(512, 1000, 0x5001_4050_0000_0001);
    c.product = "test disk".to_owned();
    c.revision = "1.0".to_owned();
    c.serial = "SERIAL01".to_owned();
    c.max_transfer_blocks = 128;
    c.max_write_same_blocks = 256;
    c.provisioning = Some(Provisioning {
        max_unmap_blocks: 1000,
        max_unmap_descriptors: 4,
        unmap_granularity_blocks: 8,
        unmapped_reads_zero: true,
    });
    c
}

pub(crate) fn lu() -> LogicalUnit {
    lu_with(|_| {})
}

pub(crate) fn lu_with(change: impl FnOnce(&mut LuConfig)) -> LogicalUnit {
    let mut c = config();
    change(&mut c);
    LogicalUnit::new(c).expect("valid test config")
}

pub(crate) fn execute(
    lu: &LogicalUnit,
    n: NexusId,
    cdb: &[u8],
) -> Result<Completion<'static>, ScsiError> {
    let mut buf = [0u8; crate::DATA_IN_LEN];
    lu.execute(n, cdb, &[], &mut buf)
}

pub(crate) fn execute_out<'d>(
    lu: &LogicalUnit,
    n: NexusId,
    cdb: &[u8],
    data_out: &'d [u8],
) -> Result<Completion<'d>, ScsiError> {
    let mut buf = [0u8; crate::DATA_IN_LEN];
    lu.execute(n, cdb, data_out, &mut buf)
}

/// Runs a command that must return data, and returns the data.
pub(crate) fn execute_data(lu: &LogicalUnit, n: NexusId, cdb: &[u8]) -> Vec<u8> {
    let mut buf = [0u8; crate::DATA_IN_LEN];
    match lu.execute(n, cdb, &[], &mut buf) {
        Ok(Completion::Data { len }) => buf[..len].to_vec(),
        other => panic!("expected data from {cdb:02x?}, got {other:?}"),
    }
}
