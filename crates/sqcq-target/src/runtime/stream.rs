//! Byte streams over a list of guest buffers: gather, scatter, and host
//! iovecs for zero-copy I/O.
//!
//! A request's device-readable buffers form one stream (header, then
//! data-out) and its device-writable buffers another (response, then
//! data-in); these helpers address them by stream offset, whatever the
//! guest's framing. Every access goes through the pass's [`Batch`]; an
//! address outside guest memory is an error, not a fault. The data a
//! backstore writes through [`iovecs`] (zero-copy, out of vm-memory's
//! sight) is marked in the dirty log by [`mark_written`] when it
//! completes.

use thiserror::Error;
use vm_memory::GuestAddress;

use crate::runtime::batch::Batch;
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

/// The guest address of stream bytes `offset..offset + len` when they lie
/// in one buffer: a request's header, its response and its data buffer
/// nearly always do, and then an access is one lookup and one copy
/// without [`for_each_piece`]'s walk.
#[inline]
fn one_piece(segs: &[Segment], offset: u64, len: u64) -> Option<u64> {
    let mut skip = offset;
    for seg in segs {
        let seg_len = u64::from(seg.len);
        if skip < seg_len {
            return (len <= seg_len - skip).then(|| seg.addr.0.checked_add(skip))?;
        }
        skip -= seg_len;
    }
    None
}

/// Copies `buf.len()` bytes from the stream at `offset` into `buf`.
pub fn read_at(
    m: Batch<'_>,
    segs: &[Segment],
    offset: u64,
    buf: &mut [u8],
) -> Result<(), GuestError> {
    let len = buf.len() as u64;
    if let Some(gpa) = one_piece(segs, offset, len) {
        return m.read(gpa, buf).map_err(GuestError::Memory);
    }
    for_each_piece(segs, offset, len, |addr, start, n| {
        m.read(addr.0, &mut buf[start..start + n])
            .map_err(GuestError::Memory)
    })
}

/// Copies `buf` into the stream at `offset`.
pub fn write_at(m: Batch<'_>, segs: &[Segment], offset: u64, buf: &[u8]) -> Result<(), GuestError> {
    let len = buf.len() as u64;
    if buf.is_empty() {
        return Ok(());
    }
    if let Some(gpa) = one_piece(segs, offset, len) {
        return m.write(gpa, buf).map_err(GuestError::Memory);
    }
    for_each_piece(segs, offset, len, |addr, start, n| {
        m.write(addr.0, &buf[start..start + n])
            .map_err(GuestError::Memory)
    })
}

/// Copies the `N` bytes of `buf` into the stream at `offset`: as
/// [`write_at`], but one store of `N` bytes when they go to one buffer (a
/// response's fixed part), not a `memcpy` call.
pub fn write_bytes_at<const N: usize>(
    m: Batch<'_>,
    segs: &[Segment],
    offset: u64,
    buf: &[u8; N],
) -> Result<(), GuestError> {
    if let Some(gpa) = one_piece(segs, offset, N as u64) {
        return m.write_bytes(gpa, buf).map_err(GuestError::Memory);
    }
    write_at(m, segs, offset, buf)
}

/// Appends host iovecs covering the stream range `offset..offset + len` to
/// `out` (a guest buffer that spans two memory regions gives two iovecs).
///
/// The iovecs point into the mappings of the batch's map; they stay valid
/// as long as that map (an `Arc` of it, a request's pin) is alive. What
/// the backstore writes through them is marked by [`mark_written`].
pub fn iovecs(
    m: Batch<'_>,
    segs: &[Segment],
    offset: u64,
    len: u64,
    out: &mut Vec<libc::iovec>,
) -> Result<(), GuestError> {
    for_each_piece(segs, offset, len, |addr, _start, n| {
        m.iovecs(addr.0, n, out).map_err(GuestError::Memory)
    })
}

/// Marks the stream range `offset..offset + len` as written by the device
/// (data a backstore wrote through [`iovecs`]); nothing while dirty
/// logging is off. Ranges outside guest memory are skipped: [`iovecs`]
/// refused them before anything was written.
pub fn mark_written(m: Batch<'_>, segs: &[Segment], offset: u64, len: u64) {
    if !m.logged() {
        return;
    }
    let _ = for_each_piece(segs, offset, len, |addr, _start, n| {
        m.mark(addr.0, n);
        Ok(())
    });
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vm_memory::bitmap::Bitmap;
    use vm_memory::{Bytes, GuestMemoryBackend, GuestMemoryRegion};

    use super::*;
    use crate::runtime::batch::Mapped;
    use crate::runtime::guest::{GuestMem, memory_over, test_memory};

    fn mapped(m: GuestMem) -> Mapped {
        Mapped::new(Arc::new(m))
    }

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
        let mapped = mapped(test_memory(&[(GuestAddress(0), 0x10000)]));
        let (b, m) = (mapped.batch(), mapped.map());
        let data: Vec<u8> = (0..25).collect();
        write_at(b, &segs(), 3, &data).unwrap();
        let mut back = [0u8; 25];
        read_at(b, &segs(), 3, &mut back).unwrap();
        assert_eq!(&back[..], &data[..]);
        let mut first = [0u8; 7];
        m.read_slice(&mut first, GuestAddress(0x1003)).unwrap();
        assert_eq!(first, [0, 1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn one_piece_is_found_only_inside_one_buffer() {
        let s = segs();
        assert_eq!(one_piece(&s, 0, 10), Some(0x1000));
        assert_eq!(one_piece(&s, 4, 6), Some(0x1004));
        assert_eq!(one_piece(&s, 4, 7), None, "runs into the next buffer");
        assert_eq!(
            one_piece(&s, 10, 5),
            Some(0x3000),
            "the empty one is skipped"
        );
        assert_eq!(one_piece(&s, 29, 1), Some(0x3013));
        assert_eq!(one_piece(&s, 30, 0), None, "past the end");
        let wraps = [Segment {
            addr: GuestAddress(u64::MAX),
            len: 8,
        }];
        assert_eq!(one_piece(&wraps, 2, 1), None);
    }

    #[test]
    fn accesses_in_one_buffer_and_across_buffers_agree() {
        let mapped = mapped(test_memory(&[(GuestAddress(0), 0x10000)]));
        let m = mapped.batch();
        let data: Vec<u8> = (100..125).collect();
        // One piece (the table), then across buffers (vm-memory).
        write_at(m, &segs(), 12, &data[..5]).unwrap();
        write_at(m, &segs(), 0, &data[..12]).unwrap();
        let mut back = [0u8; 17];
        read_at(m, &segs(), 0, &mut back).unwrap();
        assert_eq!(
            back,
            [
                100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 100, 101, 102, 103, 104
            ]
        );
        let mut one = [0u8; 3];
        read_at(m, &segs(), 13, &mut one).unwrap();
        assert_eq!(one, [101, 102, 103]);
        let mut out = Vec::new();
        iovecs(m, &segs(), 10, 20, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].iov_len, 20);
        let at = out[0].iov_base.cast::<u8>().wrapping_add(3);
        // SAFETY: the iovec points at 20 mapped bytes of `m`, alive here.
        let byte13 = unsafe { *at };
        assert_eq!(byte13, 101, "written by the first write");
        out.clear();
        iovecs(m, &segs(), 3, 0, &mut out).unwrap();
        assert!(out.is_empty(), "nothing to transfer, no iovec");
        assert!(matches!(
            read_at(m, &segs(), 25, &mut [0u8; 6]),
            Err(GuestError::Short { .. })
        ));
        // Fixed-size writes: one store inside a buffer, pieces across two.
        write_bytes_at(m, &segs(), 1, &[7u8; 4]).unwrap();
        write_bytes_at(m, &segs(), 8, &[9u8; 4]).unwrap();
        let mut back = [0u8; 14];
        read_at(m, &segs(), 0, &mut back).unwrap();
        assert_eq!(back, [100, 7, 7, 7, 7, 105, 106, 107, 9, 9, 9, 9, 100, 101]);
        assert!(matches!(
            write_bytes_at(m, &segs(), 28, &[0u8; 4]),
            Err(GuestError::Short { .. })
        ));
    }

    #[test]
    fn short_stream_is_an_error() {
        let mapped = mapped(test_memory(&[(GuestAddress(0), 0x10000)]));
        let m = mapped.batch();
        let mut buf = [0u8; 31];
        assert!(matches!(
            read_at(m, &segs(), 0, &mut buf),
            Err(GuestError::Short { .. })
        ));
    }

    #[test]
    fn outside_memory_is_an_error() {
        let mapped = mapped(test_memory(&[(GuestAddress(0), 0x2000)]));
        let m = mapped.batch();
        let mut buf = [0u8; 15];
        assert!(matches!(
            read_at(m, &segs(), 0, &mut buf),
            Err(GuestError::Memory(_))
        ));
    }

    #[test]
    fn iovecs_split_at_region_boundaries() {
        let mapped = mapped(test_memory(&[
            (GuestAddress(0), 0x1000),
            (GuestAddress(0x1000), 0x1000),
        ]));
        let m = mapped.batch();
        let s = [Segment {
            addr: GuestAddress(0xf00),
            len: 0x200,
        }];
        let mut out = Vec::new();
        iovecs(m, &s, 0, 0x200, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].iov_len + out[1].iov_len, 0x200);
    }

    fn dirty(m: &GuestMem, gpa: u64) -> bool {
        let r = m.find_region(GuestAddress(gpa)).unwrap();
        r.bitmap()
            .dirty_at(usize::try_from(gpa - r.start_addr().0).unwrap())
    }

    #[test]
    fn marking_covers_the_pages_of_the_range_and_no_others() {
        let mapped = mapped(memory_over(&[(GuestAddress(0), 0x10000)], true));
        let m = mapped.map();
        // Stream bytes 5..15: the last 5 of the first buffer, the first 5
        // of the third.
        mark_written(mapped.batch(), &segs(), 5, 10);
        assert!(dirty(m, 0x1000) && dirty(m, 0x3000));
        assert!(!dirty(m, 0x2000) && !dirty(m, 0x4000) && !dirty(m, 0));
    }

    #[test]
    fn without_logging_marking_does_nothing() {
        let mapped = mapped(test_memory(&[(GuestAddress(0), 0x10000)]));
        mark_written(mapped.batch(), &segs(), 0, 30);
        assert!(!dirty(mapped.map(), 0x1000));
    }
}
