//! The null backstore: reads return zeros, writes are dropped.

use crate::capacity::Capacity;
use crate::slots::{Immediate, ImmediateQueue};
use crate::{Backstore, BackstoreError, BackstoreQueue, Geometry, IoOp, check_range};

/// A backstore that stores nothing, like Linux's null_blk: what it measures
/// is the transport alone. Reads are zero-filled so that an initiator never
/// sees stale memory.
#[derive(Debug)]
pub struct NullBackstore {
    geometry: Geometry,
    capacity: Capacity,
}

impl NullBackstore {
    /// A null backstore of `bytes` bytes in blocks of `block_size`.
    pub fn new(bytes: u64, block_size: u32) -> Result<Self, BackstoreError> {
        let geometry = crate::ram::validated_geometry(bytes, block_size)?;
        Ok(NullBackstore {
            geometry: Geometry {
                unmapped_reads_zero: true,
                ..geometry
            },
            capacity: Capacity::new(bytes),
        })
    }
}

impl Backstore for NullBackstore {
    fn geometry(&self) -> Geometry {
        Geometry {
            blocks: self.capacity.get() / u64::from(self.geometry.block_size),
            ..self.geometry
        }
    }

    fn open_queue(&self, depth: u32) -> Result<Box<dyn BackstoreQueue>, BackstoreError> {
        let store = NullQueue {
            capacity: self.capacity.clone(),
        };
        Ok(Box::new(ImmediateQueue::new(store, depth)))
    }

    fn resize(&self, bytes: u64) -> Result<Geometry, BackstoreError> {
        crate::ram::validated_geometry(bytes, self.geometry.block_size)?;
        self.capacity.set(bytes);
        Ok(self.geometry())
    }
}

#[derive(Debug)]
struct NullQueue {
    capacity: Capacity,
}

impl Immediate for NullQueue {
    unsafe fn perform(
        &mut self,
        op: IoOp,
        iov: &[libc::iovec],
        len: u32,
    ) -> Result<u32, BackstoreError> {
        match op {
            IoOp::Read { offset } => {
                check_range(offset, u64::from(len), self.capacity.get()).map(|()| {
                    for v in iov {
                        // SAFETY: `submit`'s contract: each iovec is valid for
                        // writes of its length until completion is reaped.
                        unsafe { std::ptr::write_bytes(v.iov_base.cast::<u8>(), 0, v.iov_len) };
                    }
                    len
                })
            }
            IoOp::Write { offset, .. } => {
                check_range(offset, u64::from(len), self.capacity.get()).map(|()| len)
            }
            IoOp::Flush => Ok(0),
            IoOp::Discard { offset, len } | IoOp::WriteZeroes { offset, len } => {
                check_range(offset, len, self.capacity.get()).map(|()| 0)
            }
        }
    }
}
