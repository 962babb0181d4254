//! The virtio-blk wire format (virtio 1.2, section 5.2): the request
//! header, the status byte, discard and write-zeroes segments, the device
//! ID and the configuration space.
//!
//! Sizes and field offsets are those of `virtio-bindings`' `virtio_blk`
//! structures. A request is a device-readable header
//! ([`RequestHeader`]), then data (device-readable for OUT, DISCARD and
//! WRITE_ZEROES, device-writable for IN and GET_ID), then one
//! device-writable status byte.

use core::mem::{offset_of, size_of};

use virtio_bindings::virtio_blk::{
    self as vb, virtio_blk_config, virtio_blk_discard_write_zeroes, virtio_blk_outhdr,
};

use crate::{bytes_at, le16, le32, le64, put};

pub use vb::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_CONFIG_WCE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH,
    VIRTIO_BLK_F_GEOMETRY, VIRTIO_BLK_F_MQ, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX,
    VIRTIO_BLK_F_SIZE_MAX, VIRTIO_BLK_F_TOPOLOGY, VIRTIO_BLK_F_WRITE_ZEROES,
};

/// virtio-blk addresses the disk in 512-byte sectors whatever its block
/// size.
pub const SECTOR_SIZE: u64 = 512;
/// `log2(SECTOR_SIZE)`.
pub const SECTOR_SHIFT: u32 = 9;

/// Size of the request header (`virtio_blk_outhdr`).
pub const HEADER_SIZE: usize = size_of::<virtio_blk_outhdr>();
/// Size of the status the device writes last.
pub const STATUS_SIZE: usize = 1;
/// Size of a GET_ID answer (a serial, zero-padded, not terminated when
/// it fills all of them).
pub const ID_BYTES: usize = vb::VIRTIO_BLK_ID_BYTES as usize;
/// Size of one discard or write-zeroes segment.
pub const SEGMENT_SIZE: usize = size_of::<virtio_blk_discard_write_zeroes>();
/// Write-zeroes segment flag: the device may unmap the range.
pub const WRITE_ZEROES_FLAG_UNMAP: u32 = vb::VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP;
/// Size of the configuration space (every field this crate knows,
/// zoned characteristics included).
pub const CONFIG_SIZE: usize = size_of::<virtio_blk_config>();
/// Size of the configuration space up to the write-zeroes fields
/// (`unused1` included): what a driver reads when it negotiates neither
/// VIRTIO_BLK_F_SECURE_ERASE nor VIRTIO_BLK_F_ZONED, and all a device
/// built on older headers (QEMU 7.2's qemu-storage-daemon) serves.
pub const CONFIG_SIZE_BASE: usize = offset_of!(virtio_blk_config, max_secure_erase_sectors);
/// Offset of `writeback` (`wce`), the one field a driver may write (with
/// VIRTIO_BLK_F_CONFIG_WCE).
pub const CONFIG_WCE_OFFSET: usize = offset_of!(virtio_blk_config, wce);

/// What a request asks for (`VIRTIO_BLK_T_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestType {
    /// Read sectors.
    In,
    /// Write sectors.
    Out,
    /// Make every completed write durable.
    Flush,
    /// The device ID (serial).
    GetId,
    /// Discard sector ranges.
    Discard,
    /// Write zeroes to sector ranges (maybe unmapping them).
    WriteZeroes,
    /// Securely erase sector ranges.
    SecureErase,
    /// A type this device does not know (answered UNSUPP).
    Other(u32),
}

/// Every known type with its value.
const TYPES: [(RequestType, u32); 7] = [
    (RequestType::In, vb::VIRTIO_BLK_T_IN),
    (RequestType::Out, vb::VIRTIO_BLK_T_OUT),
    (RequestType::Flush, vb::VIRTIO_BLK_T_FLUSH),
    (RequestType::GetId, vb::VIRTIO_BLK_T_GET_ID),
    (RequestType::Discard, vb::VIRTIO_BLK_T_DISCARD),
    (RequestType::WriteZeroes, vb::VIRTIO_BLK_T_WRITE_ZEROES),
    (RequestType::SecureErase, vb::VIRTIO_BLK_T_SECURE_ERASE),
];

impl RequestType {
    /// Decodes the `type` field.
    pub fn from_u32(v: u32) -> Self {
        TYPES
            .iter()
            .find(|&&(_, t)| t == v)
            .map_or(Self::Other(v), |&(r, _)| r)
    }

    /// The `type` field.
    pub fn to_u32(self) -> u32 {
        match self {
            Self::Other(v) => v,
            known => TYPES
                .iter()
                .find(|&&(r, _)| r == known)
                .map_or(u32::MAX, |&(_, v)| v),
        }
    }
}

/// The request header (`virtio_blk_outhdr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    /// What the request asks for.
    pub kind: RequestType,
    /// I/O priority (a hint; devices may ignore it).
    pub ioprio: u32,
    /// First 512-byte sector (IN, OUT).
    pub sector: u64,
}

impl RequestHeader {
    /// Decodes the header.
    pub fn decode(b: &[u8; HEADER_SIZE]) -> Self {
        Self {
            kind: RequestType::from_u32(le32(b, offset_of!(virtio_blk_outhdr, type_))),
            ioprio: le32(b, offset_of!(virtio_blk_outhdr, ioprio)),
            sector: le64(b, offset_of!(virtio_blk_outhdr, sector)),
        }
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut out = [0u8; HEADER_SIZE];
        put(
            &mut out,
            offset_of!(virtio_blk_outhdr, type_),
            &self.kind.to_u32().to_le_bytes(),
        );
        put(
            &mut out,
            offset_of!(virtio_blk_outhdr, ioprio),
            &self.ioprio.to_le_bytes(),
        );
        put(
            &mut out,
            offset_of!(virtio_blk_outhdr, sector),
            &self.sector.to_le_bytes(),
        );
        out
    }
}

/// A small constant of the specification as a byte.
#[allow(clippy::cast_possible_truncation)]
const fn byte(v: u32) -> u8 {
    assert!(v <= 0xff);
    v as u8
}

/// The status byte of a completed request (`VIRTIO_BLK_S_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// Done.
    Ok = byte(vb::VIRTIO_BLK_S_OK),
    /// The device or the medium failed (also: a malformed request).
    IoErr = byte(vb::VIRTIO_BLK_S_IOERR),
    /// The request type is not supported.
    Unsupp = byte(vb::VIRTIO_BLK_S_UNSUPP),
}

impl Status {
    /// Decodes a status byte a device wrote; `None` for a value the
    /// specification does not define for this device.
    pub fn from_byte(b: u8) -> Option<Self> {
        [Self::Ok, Self::IoErr, Self::Unsupp]
            .into_iter()
            .find(|s| *s as u8 == b)
    }
}

/// One range of a DISCARD, WRITE_ZEROES or SECURE_ERASE request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// First 512-byte sector.
    pub sector: u64,
    /// Sectors.
    pub num_sectors: u32,
    /// `WRITE_ZEROES_FLAG_UNMAP`, or 0; other bits are reserved.
    pub flags: u32,
}

impl Segment {
    /// Decodes a segment.
    pub fn decode(b: &[u8; SEGMENT_SIZE]) -> Self {
        Self {
            sector: le64(b, offset_of!(virtio_blk_discard_write_zeroes, sector)),
            num_sectors: le32(b, offset_of!(virtio_blk_discard_write_zeroes, num_sectors)),
            flags: le32(b, offset_of!(virtio_blk_discard_write_zeroes, flags)),
        }
    }

    /// Encodes a segment.
    pub fn encode(&self) -> [u8; SEGMENT_SIZE] {
        let mut out = [0u8; SEGMENT_SIZE];
        put(
            &mut out,
            offset_of!(virtio_blk_discard_write_zeroes, sector),
            &self.sector.to_le_bytes(),
        );
        put(
            &mut out,
            offset_of!(virtio_blk_discard_write_zeroes, num_sectors),
            &self.num_sectors.to_le_bytes(),
        );
        put(
            &mut out,
            offset_of!(virtio_blk_discard_write_zeroes, flags),
            &self.flags.to_le_bytes(),
        );
        out
    }
}

/// The GET_ID answer for `serial`: its bytes, cut at [`ID_BYTES`] and
/// zero-padded.
pub fn encode_id(serial: &str) -> [u8; ID_BYTES] {
    let mut out = [0u8; ID_BYTES];
    let n = serial.len().min(ID_BYTES);
    out[..n].copy_from_slice(&serial.as_bytes()[..n]);
    out
}

/// The device configuration space (`virtio_blk_config`), without the
/// zoned characteristics (this project offers no zoned device).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlkConfig {
    /// Capacity in 512-byte sectors.
    pub capacity: u64,
    /// Largest segment in bytes (VIRTIO_BLK_F_SIZE_MAX).
    pub size_max: u32,
    /// Most data segments in a request (VIRTIO_BLK_F_SEG_MAX).
    pub seg_max: u32,
    /// Legacy geometry: cylinders, heads, sectors (VIRTIO_BLK_F_GEOMETRY).
    pub geometry: (u16, u8, u8),
    /// Logical block size (VIRTIO_BLK_F_BLK_SIZE).
    pub blk_size: u32,
    /// Logical blocks per physical block, as a power of two
    /// (VIRTIO_BLK_F_TOPOLOGY, like the three below).
    pub physical_block_exp: u8,
    /// Offset of the first aligned logical block.
    pub alignment_offset: u8,
    /// Smallest efficient I/O, in logical blocks.
    pub min_io_size: u16,
    /// Best I/O size, in logical blocks.
    pub opt_io_size: u32,
    /// Write-back cache on (1) or write-through (0)
    /// (VIRTIO_BLK_F_CONFIG_WCE).
    pub writeback: u8,
    /// Request queues (VIRTIO_BLK_F_MQ).
    pub num_queues: u16,
    /// Largest discard, in sectors (VIRTIO_BLK_F_DISCARD, like the two
    /// below).
    pub max_discard_sectors: u32,
    /// Most segments in a discard request.
    pub max_discard_seg: u32,
    /// Discard alignment, in sectors.
    pub discard_sector_alignment: u32,
    /// Largest write-zeroes, in sectors (VIRTIO_BLK_F_WRITE_ZEROES, like
    /// the two below).
    pub max_write_zeroes_sectors: u32,
    /// Most segments in a write-zeroes request.
    pub max_write_zeroes_seg: u32,
    /// Whether a write-zeroes with UNMAP may unmap.
    pub write_zeroes_may_unmap: u8,
    /// Largest secure erase, in sectors (VIRTIO_BLK_F_SECURE_ERASE, like
    /// the two below).
    pub max_secure_erase_sectors: u32,
    /// Most segments in a secure erase request.
    pub max_secure_erase_seg: u32,
    /// Secure erase alignment, in sectors.
    pub secure_erase_sector_alignment: u32,
}

/// Offsets of the 32-bit fields, with their accessors.
type Word = (usize, fn(&BlkConfig) -> u32, fn(&mut BlkConfig, u32));

const WORDS: [Word; 11] = [
    (
        offset_of!(virtio_blk_config, size_max),
        |c| c.size_max,
        |c, v| c.size_max = v,
    ),
    (
        offset_of!(virtio_blk_config, seg_max),
        |c| c.seg_max,
        |c, v| c.seg_max = v,
    ),
    (
        offset_of!(virtio_blk_config, blk_size),
        |c| c.blk_size,
        |c, v| c.blk_size = v,
    ),
    (
        offset_of!(virtio_blk_config, opt_io_size),
        |c| c.opt_io_size,
        |c, v| c.opt_io_size = v,
    ),
    (
        offset_of!(virtio_blk_config, max_discard_sectors),
        |c| c.max_discard_sectors,
        |c, v| c.max_discard_sectors = v,
    ),
    (
        offset_of!(virtio_blk_config, max_discard_seg),
        |c| c.max_discard_seg,
        |c, v| c.max_discard_seg = v,
    ),
    (
        offset_of!(virtio_blk_config, discard_sector_alignment),
        |c| c.discard_sector_alignment,
        |c, v| c.discard_sector_alignment = v,
    ),
    (
        offset_of!(virtio_blk_config, max_write_zeroes_sectors),
        |c| c.max_write_zeroes_sectors,
        |c, v| c.max_write_zeroes_sectors = v,
    ),
    (
        offset_of!(virtio_blk_config, max_write_zeroes_seg),
        |c| c.max_write_zeroes_seg,
        |c, v| c.max_write_zeroes_seg = v,
    ),
    (
        offset_of!(virtio_blk_config, max_secure_erase_sectors),
        |c| c.max_secure_erase_sectors,
        |c, v| c.max_secure_erase_sectors = v,
    ),
    (
        offset_of!(virtio_blk_config, max_secure_erase_seg),
        |c| c.max_secure_erase_seg,
        |c, v| c.max_secure_erase_seg = v,
    ),
];

/// Offsets of the byte fields, with their accessors.
type Byte = (usize, fn(&BlkConfig) -> u8, fn(&mut BlkConfig, u8));

const BYTES: [Byte; 6] = [
    (
        offset_of!(virtio_blk_config, geometry.heads),
        |c| c.geometry.1,
        |c, v| c.geometry.1 = v,
    ),
    (
        offset_of!(virtio_blk_config, geometry.sectors),
        |c| c.geometry.2,
        |c, v| c.geometry.2 = v,
    ),
    (
        offset_of!(virtio_blk_config, physical_block_exp),
        |c| c.physical_block_exp,
        |c, v| c.physical_block_exp = v,
    ),
    (
        offset_of!(virtio_blk_config, alignment_offset),
        |c| c.alignment_offset,
        |c, v| c.alignment_offset = v,
    ),
    (CONFIG_WCE_OFFSET, |c| c.writeback, |c, v| c.writeback = v),
    (
        offset_of!(virtio_blk_config, write_zeroes_may_unmap),
        |c| c.write_zeroes_may_unmap,
        |c, v| c.write_zeroes_may_unmap = v,
    ),
];

const CYLINDERS: usize = offset_of!(virtio_blk_config, geometry.cylinders);
const MIN_IO_SIZE: usize = offset_of!(virtio_blk_config, min_io_size);
const NUM_QUEUES: usize = offset_of!(virtio_blk_config, num_queues);
const SECURE_ERASE_ALIGNMENT: usize = offset_of!(virtio_blk_config, secure_erase_sector_alignment);

impl BlkConfig {
    /// Encodes the configuration space (zoned characteristics zero).
    pub fn encode(&self) -> [u8; CONFIG_SIZE] {
        let mut out = [0u8; CONFIG_SIZE];
        put(
            &mut out,
            offset_of!(virtio_blk_config, capacity),
            &self.capacity.to_le_bytes(),
        );
        for (at, get, _) in WORDS {
            put(&mut out, at, &get(self).to_le_bytes());
        }
        put(
            &mut out,
            SECURE_ERASE_ALIGNMENT,
            &self.secure_erase_sector_alignment.to_le_bytes(),
        );
        for (at, get, _) in BYTES {
            out[at] = get(self);
        }
        put(&mut out, CYLINDERS, &self.geometry.0.to_le_bytes());
        put(&mut out, MIN_IO_SIZE, &self.min_io_size.to_le_bytes());
        put(&mut out, NUM_QUEUES, &self.num_queues.to_le_bytes());
        out
    }

    /// Decodes as much of the configuration space as `bytes` holds (a
    /// device may offer a shorter one than this crate knows, when it does
    /// not offer the features of the last fields); missing fields read as
    /// zero. `None` when not even the capacity is there.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let capacity_at = offset_of!(virtio_blk_config, capacity);
        let mut full = [0u8; CONFIG_SIZE];
        let n = bytes.len().min(CONFIG_SIZE);
        if n < capacity_at + 8 {
            return None;
        }
        full[..n].copy_from_slice(&bytes[..n]);
        let mut c = BlkConfig {
            capacity: u64::from_le_bytes(bytes_at(&full, capacity_at)),
            geometry: (le16(&full, CYLINDERS), 0, 0),
            min_io_size: le16(&full, MIN_IO_SIZE),
            num_queues: le16(&full, NUM_QUEUES),
            secure_erase_sector_alignment: le32(&full, SECURE_ERASE_ALIGNMENT),
            ..BlkConfig::default()
        };
        for (at, _, set) in WORDS {
            set(&mut c, le32(&full, at));
        }
        for (at, _, set) in BYTES {
            set(&mut c, full[at]);
        }
        Some(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_offsets_are_the_specifications() {
        assert_eq!((HEADER_SIZE, SEGMENT_SIZE, ID_BYTES), (16, 16, 20));
        assert_eq!(CONFIG_WCE_OFFSET, 32);
        assert_eq!(CONFIG_SIZE_BASE, 60);
        assert_eq!((CYLINDERS, MIN_IO_SIZE, NUM_QUEUES), (16, 26, 34));
        assert_eq!(SECURE_ERASE_ALIGNMENT, 68);
        let offsets: Vec<usize> = WORDS.iter().map(|w| w.0).collect();
        assert_eq!(offsets, [8, 12, 20, 28, 36, 40, 44, 48, 52, 60, 64]);
        let offsets: Vec<usize> = BYTES.iter().map(|b| b.0).collect();
        assert_eq!(offsets, [18, 19, 24, 25, 32, 56]);
    }

    #[test]
    fn a_request_header_round_trips_byte_exact() {
        let h = RequestHeader {
            kind: RequestType::Out,
            ioprio: 3,
            sector: 0x0102_0304_0506_0708,
        };
        let b = h.encode();
        assert_eq!(
            b,
            [1, 0, 0, 0, 3, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1],
            "little endian, type first"
        );
        assert_eq!(RequestHeader::decode(&b), h);
        let mut odd = b;
        odd[0] = 99;
        assert_eq!(RequestHeader::decode(&odd).kind, RequestType::Other(99));
    }

    #[test]
    fn request_types_and_statuses_map_to_the_bindings_values() {
        for v in 0..64 {
            let t = RequestType::from_u32(v);
            assert_eq!(t.to_u32(), v);
            let known = [0, 1, 4, 8, 11, 13, 14].contains(&v);
            assert_eq!(!matches!(t, RequestType::Other(_)), known, "type {v}");
        }
        assert_eq!(RequestType::from_u32(8), RequestType::GetId);
        assert_eq!(Status::Unsupp as u8, 2);
        assert_eq!(Status::from_byte(1), Some(Status::IoErr));
        assert_eq!(Status::from_byte(3), None);
    }

    #[test]
    fn segments_and_ids_encode_as_the_specification_says() {
        let s = Segment {
            sector: 9,
            num_sectors: 0x10,
            flags: WRITE_ZEROES_FLAG_UNMAP,
        };
        let b = s.encode();
        assert_eq!(b, [9, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(Segment::decode(&b), s);
        assert_eq!(&encode_id("disk0")[..6], b"disk0\0");
        assert_eq!(encode_id(&"x".repeat(30)), [b'x'; ID_BYTES]);
    }

    #[test]
    fn the_config_space_round_trips_and_tolerates_short_reads() {
        let c = BlkConfig {
            capacity: 1 << 21,
            size_max: 1 << 20,
            seg_max: 126,
            geometry: (1024, 16, 63),
            blk_size: 4096,
            physical_block_exp: 0,
            alignment_offset: 0,
            min_io_size: 1,
            opt_io_size: 256,
            writeback: 1,
            num_queues: 4,
            max_discard_sectors: u32::MAX,
            max_discard_seg: 1,
            discard_sector_alignment: 8,
            max_write_zeroes_sectors: 0xffff,
            max_write_zeroes_seg: 1,
            write_zeroes_may_unmap: 1,
            max_secure_erase_sectors: 0,
            max_secure_erase_seg: 0,
            secure_erase_sector_alignment: 0,
        };
        let b = c.encode();
        assert_eq!(&b[..8], &(1u64 << 21).to_le_bytes());
        assert_eq!(&b[20..24], &4096u32.to_le_bytes());
        assert_eq!(&b[34..36], &4u16.to_le_bytes());
        assert_eq!(b[32], 1);
        assert_eq!(BlkConfig::decode(&b), Some(c));
        let short = BlkConfig::decode(&b[..36]).unwrap();
        assert_eq!((short.capacity, short.num_queues), (c.capacity, 4));
        assert_eq!(short.max_discard_sectors, 0, "past the end: zero");
        assert_eq!(BlkConfig::decode(&b[..7]), None);
    }
}
