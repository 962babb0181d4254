//! The null backstore: reads return zeros, writes are dropped.

use crate::capacity::Capacity;
use crate::slots::{Immediate, ImmediateQueue};
use crate::{Backstore, BackstoreError, BackstoreQueue, Geometry, IoOp, check_range};

/// A backstore that stores nothing, like Linux's null_blk and SPDK's null
/// bdev: what it measures is the transport alone. Like theirs, by default
/// it does not touch data: a read leaves the initiator's buffer as it was
/// (the initiator's own memory, so nothing leaks), which keeps a memset of
/// every byte read off the path being measured. [`zero_reads`] makes reads
/// fill their buffers with zeros instead (null_blk's `memory_backed` is the
/// closest; SPDK has no such option), and only then does the LUN report
/// that unmapped blocks read as zeros.
///
/// [`zero_reads`]: NullBackstore::zero_reads
#[derive(Debug)]
pub struct NullBackstore {
    geometry: Geometry,
    capacity: Capacity,
    zero: bool,
}

impl NullBackstore {
    /// A null backstore of `bytes` bytes in blocks of `block_size`; reads
    /// leave their buffers untouched.
    pub fn new(bytes: u64, block_size: u32) -> Result<Self, BackstoreError> {
        let geometry = crate::ram::validated_geometry(bytes, block_size)?;
        Ok(NullBackstore {
            geometry: Geometry {
                unmapped_reads_zero: false,
                ..geometry
            },
            capacity: Capacity::new(bytes),
            zero: false,
        })
    }

    /// Whether reads fill their buffers with zeros (and the LUN says
    /// unmapped blocks read as zeros).
    #[must_use]
    pub fn zero_reads(mut self, zero: bool) -> Self {
        self.zero = zero;
        self.geometry.unmapped_reads_zero = zero;
        self
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
            zero: self.zero,
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
    zero: bool,
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
                    for v in iov.iter().filter(|_| self.zero) {
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
