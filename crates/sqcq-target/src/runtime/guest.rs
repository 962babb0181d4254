//! Byte streams over a list of guest buffers: gather, scatter, and host
//! iovecs for zero-copy I/O.
//!
//! A request's device-readable buffers form one stream (header, then
//! data-out) and its device-writable buffers another (response, then
//! data-in); these helpers address them by stream offset, whatever the
//! guest's framing. Every access goes through vm-memory's checked
//! accessors; an address outside guest memory is an error, not a fault.

use thiserror::Error;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::runtime::chain::Segment;

/// A guest buffer could not be accessed.
#[derive(Debug, Error)]
pub enum GuestError {
    /// The stream is shorter than the access.
    #[error("access of {len} bytes at stream offset {offset} exceeds the buffers")]
    Short {
        /// Stream offset of the access.
        offset: u64,
        /// Its length.
        len: u64,
    },
    /// Guest memory refused the access (address outside guest memory).
    #[error("guest memory access failed")]
    Memory(#[source] vm_memory::GuestMemoryError),
}

/// Calls `f(guest address, range in the caller's buffer)` for each piece
/// of the stream range `offset..offset + len`.
fn for_each_piece(
    segs: &[Segment],
    offset: u64,
    len: u64,
    mut f: impl FnMut(GuestAddress, usize, usize) -> Result<(), GuestError>,
) -> Result<(), GuestError> {
    let short = || GuestError::Short { offset, len };
    let mut skip = offset;
    let mut done = 0u64;
    for seg in segs {
        if done == len {
            return Ok(());
        }
        let seg_len = u64::from(seg.len);
        if skip >= seg_len {
            skip -= seg_len;
            continue;
        }
        let take = (seg_len - skip).min(len - done);
        let addr = seg.addr.0.checked_add(skip).ok_or_else(short)?;
        let start = usize::try_from(done).map_err(|_| short())?;
        let n = usize::try_from(take).map_err(|_| short())?;
        f(GuestAddress(addr), start, n)?;
        done += take;
        skip = 0;
    }
    if done == len { Ok(()) } else { Err(short()) }
}

/// Copies `buf.len()` bytes from the stream at `offset` into `buf`.
pub fn read_at(
    mem: &GuestMemoryMmap,
    segs: &[Segment],
    offset: u64,
    buf: &mut [u8],
) -> Result<(), GuestError> {
    let len = buf.len() as u64;
    for_each_piece(segs, offset, len, |addr, start, n| {
        mem.read_slice(&mut buf[start..start + n], addr)
            .map_err(GuestError::Memory)
    })
}

/// Copies `buf` into the stream at `offset`.
pub fn write_at(
    mem: &GuestMemoryMmap,
    segs: &[Segment],
    offset: u64,
    buf: &[u8],
) -> Result<(), GuestError> {
    let len = buf.len() as u64;
    for_each_piece(segs, offset, len, |addr, start, n| {
        mem.write_slice(&buf[start..start + n], addr)
            .map_err(GuestError::Memory)
    })
}

/// Appends host iovecs covering the stream range `offset..offset + len` to
/// `out` (a guest buffer that spans two memory regions gives two iovecs).
///
/// The iovecs point into the mappings of `mem`; they stay valid as long as
/// `mem` (an `Arc` of it) is alive.
pub fn iovecs(
    mem: &GuestMemoryMmap,
    segs: &[Segment],
    offset: u64,
    len: u64,
    out: &mut Vec<libc::iovec>,
) -> Result<(), GuestError> {
    for_each_piece(segs, offset, len, |addr, _start, n| {
        for slice in mem.get_slices(addr, n) {
            let slice = slice.map_err(GuestError::Memory)?;
            out.push(libc::iovec {
                iov_base: slice.ptr_guard_mut().as_ptr().cast(),
                iov_len: slice.len(),
            });
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs() -> Vec<Segment> {
        vec![
            Segment {
                addr: GuestAddress(0x1000),
                len: 10,
            },
            Segment {
                addr: GuestAddress(0x2000),
                len: 0,
            },
            Segment {
                addr: GuestAddress(0x3000),
                len: 20,
            },
        ]
    }

    #[test]
    fn scatter_then_gather_across_segments() {
        let m = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let data: Vec<u8> = (0..25).collect();
        write_at(&m, &segs(), 3, &data).unwrap();
        let mut back = [0u8; 25];
        read_at(&m, &segs(), 3, &mut back).unwrap();
        assert_eq!(&back[..], &data[..]);
        let mut first = [0u8; 7];
        m.read_slice(&mut first, GuestAddress(0x1003)).unwrap();
        assert_eq!(first, [0, 1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn short_stream_is_an_error() {
        let m = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let mut buf = [0u8; 31];
        assert!(matches!(
            read_at(&m, &segs(), 0, &mut buf),
            Err(GuestError::Short { .. })
        ));
    }

    #[test]
    fn outside_memory_is_an_error() {
        let m = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x2000)]).unwrap();
        let mut buf = [0u8; 15];
        assert!(matches!(
            read_at(&m, &segs(), 0, &mut buf),
            Err(GuestError::Memory(_))
        ));
    }

    #[test]
    fn iovecs_split_at_region_boundaries() {
        let m = GuestMemoryMmap::<()>::from_ranges(&[
            (GuestAddress(0), 0x1000),
            (GuestAddress(0x1000), 0x1000),
        ])
        .unwrap();
        let s = [Segment {
            addr: GuestAddress(0xf00),
            len: 0x200,
        }];
        let mut out = Vec::new();
        iovecs(&m, &s, 0, 0x200, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].iov_len + out[1].iov_len, 0x200);
    }
}
