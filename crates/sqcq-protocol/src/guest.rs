//! Doorbells in guest memory reached through rust-vmm's `vm-memory`.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use thiserror::Error;
use vm_memory::{GuestAddress, GuestMemoryBackend};

use crate::doorbell::{DoorbellCell, RawDoorbell};
use crate::layout::{DOORBELL_AREA_SIZE, DoorbellLocation};

/// Byte offset of the CQ doorbell from the SQ doorbell.
const CQ_OFFSET: usize = 64;
use crate::sync::AtomicU16;

/// The doorbell area is not usable in this guest memory.
#[derive(Debug, Error)]
pub enum GuestDoorbellError {
    /// The 128 bytes are not inside one mapped region of guest memory.
    #[error("doorbell area at {addr:#x} is not inside one guest memory region")]
    NotMapped {
        /// Guest-physical address of the area.
        addr: u64,
        /// Why vm-memory refused it.
        #[source]
        source: vm_memory::GuestMemoryError,
    },
    /// The area's host mapping is not 64-byte aligned (a guest region that
    /// is mapped at an odd host offset).
    #[error("doorbell area at {addr:#x} is not 64-byte aligned in the host mapping")]
    Misaligned {
        /// Guest-physical address of the area.
        addr: u64,
    },
}

/// One doorbell in guest memory. Keeps the memory map alive, so the
/// mapping it points into cannot go away underneath it.
pub struct GuestDoorbell<M> {
    _mem: Arc<M>,
    raw: RawDoorbell,
}

impl<M> fmt::Debug for GuestDoorbell<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuestDoorbell")
            .field("raw", &self.raw)
            .finish()
    }
}

impl<M> DoorbellCell for GuestDoorbell<M> {
    fn idx(&self) -> &AtomicU16 {
        self.raw.idx()
    }
    fn flags(&self) -> &AtomicU16 {
        self.raw.flags()
    }
}

/// Maps a queue's two doorbells in guest memory. Returns `(sq, cq)`.
///
/// The memory map is shared by both cells; when the frontend replaces the
/// memory table, build new cells from the new map.
pub fn guest_doorbells<M: GuestMemoryBackend>(
    mem: &Arc<M>,
    location: DoorbellLocation,
) -> Result<(GuestDoorbell<M>, GuestDoorbell<M>), GuestDoorbellError> {
    // The CQ doorbell is by definition the 64 bytes after the SQ one; the
    // `cq` field is not trusted to say so.
    let addr = location.sq;
    let len = usize::try_from(DOORBELL_AREA_SIZE).unwrap_or(usize::MAX);
    let slice = mem
        .get_slice(GuestAddress(addr), len)
        .map_err(|source| GuestDoorbellError::NotMapped { addr, source })?;
    let base = slice.ptr_guard_mut().as_ptr();
    let base = NonNull::new(base).ok_or(GuestDoorbellError::Misaligned { addr })?;
    if base.as_ptr().align_offset(64) != 0 {
        return Err(GuestDoorbellError::Misaligned { addr });
    }
    // SAFETY: `get_slice` proved that the 128 bytes starting at `base` are
    // one contiguous mapping owned by a region of `mem`, and `base` is
    // 64-aligned (checked above), so its first 64 bytes form a doorbell.
    // Each cell holds an `Arc` of `mem`, whose regions unmap only on drop,
    // so the bytes stay mapped as long as the cell lives. The other side
    // writes this memory only through 16-bit atomic stores to the fields.
    let sq = unsafe { RawDoorbell::new(base) };
    // SAFETY: offset 64 is inside the same 128-byte mapping.
    let cq_base = unsafe { base.add(CQ_OFFSET) };
    // SAFETY: as for `sq`: the second 64 bytes of the same mapping,
    // 64-aligned since `base` is.
    let cq = unsafe { RawDoorbell::new(cq_base) };
    Ok((
        GuestDoorbell {
            _mem: Arc::clone(mem),
            raw: sq,
        },
        GuestDoorbell {
            _mem: Arc::clone(mem),
            raw: cq,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handshake::{SqConsumer, SqProducer, Wake};
    use crate::layout::{RingAddrs, doorbell_location};
    use vm_memory::{Bytes, GuestMemoryMmap};

    fn memory() -> Arc<GuestMemoryMmap> {
        Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap())
    }

    #[test]
    fn doorbells_land_at_the_computed_guest_address() {
        let mem = memory();
        let loc = doorbell_location(
            RingAddrs {
                desc: 0x1000,
                avail: 0x2000,
                used: 0x3000,
            },
            256,
        )
        .unwrap();
        let (sq, _cq) = guest_doorbells(&mem, loc).unwrap();
        let mut p = SqProducer::new(&sq);
        let mut c = SqConsumer::new(&sq, 0);
        assert_eq!(c.prepare_sleep(), crate::SleepCheck::Sleep);
        assert_eq!(p.publish(0x0102), Wake::Owed);
        let idx: u16 = mem.read_obj(GuestAddress(0x3880)).unwrap();
        let flags: u16 = mem.read_obj(GuestAddress(0x3882)).unwrap();
        assert_eq!(u16::from_le(idx), 0x0102);
        assert_eq!(u16::from_le(flags), crate::NEED_WAKEUP);
        // The peer's write through guest memory is what the consumer sees.
        mem.write_obj(7u16.to_le(), GuestAddress(0x3880)).unwrap();
        assert_eq!(c.poll(), Some(7));
    }

    #[test]
    fn area_outside_or_straddling_memory_is_refused() {
        let mem = memory();
        let outside = DoorbellLocation {
            sq: 0x20000,
            cq: 0x20040,
        };
        assert!(matches!(
            guest_doorbells(&mem, outside),
            Err(GuestDoorbellError::NotMapped { .. })
        ));
        let straddle = DoorbellLocation {
            sq: 0xffc0,
            cq: 0x10000,
        };
        assert!(matches!(
            guest_doorbells(&mem, straddle),
            Err(GuestDoorbellError::NotMapped { .. })
        ));
    }
}
