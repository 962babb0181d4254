//! The UNMAP parameter list (SBC-3): validated once, then handed to
//! the worker as an iterator over ranges that borrows the parameter data.

use crate::capacity::check_range;
use crate::config::Provisioning;
use crate::error::ScsiError;

/// Header bytes before the first block descriptor.
const HEADER: usize = 8;
/// Bytes per UNMAP block descriptor.
const DESCRIPTOR: usize = 16;

/// One range of blocks to deallocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnmapRange {
    /// First LBA.
    pub lba: u64,
    /// Number of blocks (never 0).
    pub blocks: u32,
    /// Byte offset of `lba` in the backstore.
    pub offset: u64,
    /// Length in bytes.
    pub bytes: u64,
}

/// The block descriptors of a validated UNMAP parameter list: every range
/// lies within the capacity, their count and total length are within the
/// limits of the block limits VPD page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnmapList<'d> {
    descriptors: &'d [u8],
    block_size: u32,
}

impl<'d> UnmapList<'d> {
    /// The ranges to deallocate, in parameter list order; descriptors with
    /// zero blocks are skipped.
    pub fn iter(&self) -> impl Iterator<Item = UnmapRange> + 'd {
        let bs = u64::from(self.block_size);
        self.descriptors
            .chunks_exact(DESCRIPTOR)
            .map(descriptor)
            .filter(|&(_, blocks)| blocks != 0)
            .map(move |(lba, blocks)| UnmapRange {
                lba,
                blocks,
                // Cannot overflow: every range was checked against the
                // capacity, whose byte size fits u64 (config::check_capacity).
                offset: lba.saturating_mul(bs),
                bytes: u64::from(blocks) * bs,
            })
    }

    /// Number of block descriptors (including zero-length ones).
    pub fn len(&self) -> usize {
        self.descriptors.len() / DESCRIPTOR
    }

    /// True when there is no descriptor.
    pub fn is_empty(&self) -> bool {
        self.descriptors.is_empty()
    }
}

fn descriptor(d: &[u8]) -> (u64, u32) {
    let mut lba = [0u8; 8];
    let mut blocks = [0u8; 4];
    lba.copy_from_slice(d.get(0..8).unwrap_or(&[0; 8]));
    blocks.copy_from_slice(d.get(8..12).unwrap_or(&[0; 4]));
    (u64::from_be_bytes(lba), u32::from_be_bytes(blocks))
}

/// Validates an UNMAP parameter list. `Ok(None)` means there is nothing
/// to do (a parameter list length of zero or no descriptor).
///
/// Like Linux TCM, descriptors are bounded by both the UNMAP BLOCK
/// DESCRIPTOR DATA LENGTH and the parameter data actually present; a
/// trailing partial descriptor is ignored (SBC-3).
pub(crate) fn parse<'d>(
    param_len: u16,
    data: &'d [u8],
    capacity: u64,
    block_size: u32,
    limits: &Provisioning,
) -> Result<Option<UnmapList<'d>>, ScsiError> {
    if param_len == 0 {
        return Ok(None);
    }
    let avail = data.get(..usize::from(param_len)).unwrap_or(data);
    if avail.len() < HEADER {
        return Err(ScsiError::ParameterListLength);
    }
    let bd_len = usize::from(u16::from_be_bytes([avail[2], avail[3]]));
    let body = &avail[HEADER..];
    let full = bd_len.min(body.len()) / DESCRIPTOR;
    let descriptors = &body[..full * DESCRIPTOR];
    if full == 0 {
        return Ok(None);
    }
    let max_count = usize::try_from(limits.max_unmap_descriptors).unwrap_or(usize::MAX);
    if full > max_count {
        return Err(ScsiError::parameter_field(2, Some(7)));
    }
    let mut total: u64 = 0;
    for (i, d) in descriptors.chunks_exact(DESCRIPTOR).enumerate() {
        let (lba, blocks) = descriptor(d);
        if blocks == 0 {
            continue;
        }
        check_range(lba, u64::from(blocks), capacity)?;
        total = total.saturating_add(u64::from(blocks));
        if total > u64::from(limits.max_unmap_blocks) {
            let at = HEADER + i * DESCRIPTOR + 8;
            return Err(ScsiError::parameter_field(crate::cdb::at(at), Some(7)));
        }
    }
    Ok(Some(UnmapList {
        descriptors,
        block_size,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: u64 = 1000;

    fn limits() -> Provisioning {
        Provisioning {
            max_unmap_blocks: 500,
            max_unmap_descriptors: 4,
            ..Provisioning::default()
        }
    }

    fn list(ranges: &[(u64, u32)]) -> Vec<u8> {
        let n = ranges.len() * 16;
        let mut v = Vec::new();
        v.extend_from_slice(&u16::try_from(n + 6).unwrap().to_be_bytes());
        v.extend_from_slice(&u16::try_from(n).unwrap().to_be_bytes());
        v.extend_from_slice(&[0; 4]);
        for &(lba, blocks) in ranges {
            v.extend_from_slice(&lba.to_be_bytes());
            v.extend_from_slice(&blocks.to_be_bytes());
            v.extend_from_slice(&[0; 4]);
        }
        v
    }

    fn run(param_len: usize, data: &[u8]) -> Result<Vec<(u64, u32)>, ScsiError> {
        let pl = u16::try_from(param_len).unwrap();
        parse(pl, data, CAP, 512, &limits()).map(|l| {
            l.map(|l| l.iter().map(|r| (r.lba, r.blocks)).collect())
                .unwrap_or_default()
        })
    }

    #[test]
    fn valid_list() {
        let d = list(&[(0, 8), (10, 0), (999, 1)]);
        assert_eq!(run(d.len(), &d), Ok(vec![(0, 8), (999, 1)]));
        let l = parse(56, &d, CAP, 4096, &limits()).unwrap().unwrap();
        assert_eq!(l.len(), 3);
        let r: Vec<_> = l.iter().collect();
        assert_eq!((r[1].offset, r[1].bytes), (999 * 4096, 4096));
    }

    #[test]
    fn hostile_inputs() {
        let good = list(&[(0, 8)]);
        let mut partial = list(&[(0, 8), (8, 8)]);
        partial.truncate(8 + 16 + 7);
        let mut bd_too_long = list(&[(0, 8)]);
        bd_too_long[2..4].copy_from_slice(&0xfff0u16.to_be_bytes());
        let mut bd_not_multiple = list(&[(0, 8), (8, 8)]);
        bd_not_multiple[2..4].copy_from_slice(&31u16.to_be_bytes());
        type Case = (
            &'static str,
            usize,
            Vec<u8>,
            Result<Vec<(u64, u32)>, ScsiError>,
        );
        let cases: Vec<Case> = vec![
            ("zero length", 0, vec![], Ok(vec![])),
            (
                "length under header",
                7,
                good.clone(),
                Err(ScsiError::ParameterListLength),
            ),
            (
                "data shorter than header",
                24,
                good[..5].to_vec(),
                Err(ScsiError::ParameterListLength),
            ),
            ("header only", 8, good.clone(), Ok(vec![])),
            ("no descriptors", 8, list(&[]), Ok(vec![])),
            (
                "partial descriptor ignored",
                partial.len(),
                partial,
                Ok(vec![(0, 8)]),
            ),
            (
                "bd length beyond data",
                bd_too_long.len(),
                bd_too_long,
                Ok(vec![(0, 8)]),
            ),
            (
                "bd length not multiple of 16",
                40,
                bd_not_multiple,
                Ok(vec![(0, 8)]),
            ),
            ("param len truncates", 23, good.clone(), Ok(vec![])),
            (
                "last block plus one",
                24,
                list(&[(999, 2)]),
                Err(ScsiError::LbaOutOfRange {
                    lba: 999,
                    blocks: 2,
                }),
            ),
            (
                "lba past the end",
                24,
                list(&[(1000, 1)]),
                Err(ScsiError::LbaOutOfRange {
                    lba: 1000,
                    blocks: 1,
                }),
            ),
            (
                "lba overflow",
                24,
                list(&[(u64::MAX, 2)]),
                Err(ScsiError::LbaOutOfRange {
                    lba: u64::MAX,
                    blocks: 2,
                }),
            ),
            (
                "too many descriptors",
                88,
                list(&[(0, 1); 5]),
                Err(ScsiError::parameter_field(2, Some(7))),
            ),
            (
                "too many blocks in total",
                56,
                list(&[(0, 300), (300, 300)]),
                Err(ScsiError::parameter_field(32, Some(7))),
            ),
            (
                "zero-length out of range skipped",
                24,
                list(&[(u64::MAX, 0)]),
                Ok(vec![]),
            ),
        ];
        for (name, len, data, expect) in cases {
            assert_eq!(run(len, &data), expect, "{name}");
        }
    }
}
