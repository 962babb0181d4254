//! `sqcq-wire`: the byte layouts of the virtio devices sqcq serves and
//! drives, written once for the target (`sqcq-target`), the driver
//! (`sqcq-driver`) and their tests.
//!
//! Every structure crosses guest memory as little-endian bytes. This crate
//! takes sizes, offsets and constants from `virtio-bindings` (the Linux
//! UAPI headers, generated) and encodes and decodes field by field with
//! explicit `to_le_bytes` / `from_le_bytes`, so nothing depends on the
//! host's byte order or on reading a packed struct in place; nothing here
//! trusts a length or a value that came from the other side.
//!
//! Why our own code: `virtio-bindings` has the C structures but no
//! encoding, and no crate on crates.io encodes the virtio-scsi and
//! virtio-blk requests, responses, events and configuration spaces for
//! both a device and a driver.
//!
//! - [`scsi`]: virtio-scsi (virtio 1.2, section 5.6);
//! - [`blk`]: virtio-blk (virtio 1.2, section 5.2).

#![deny(missing_docs)]

pub mod blk;
pub mod scsi;

/// Reads `N` bytes at `at` of a buffer the caller has sized (a fixed-size
/// array or a slice checked beforehand).
pub(crate) fn bytes_at<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&buf[at..at + N]);
    out
}

/// A little-endian `u32` at `at`.
pub(crate) fn le32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes_at(buf, at))
}

/// A little-endian `u16` at `at`.
pub(crate) fn le16(buf: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(bytes_at(buf, at))
}

/// A little-endian `u64` at `at`.
pub(crate) fn le64(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes_at(buf, at))
}

/// Writes `bytes` at `at`.
pub(crate) fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}
