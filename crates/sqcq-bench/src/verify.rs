//! `--verify crc32c`: what a written block holds and how a read-back block
//! is checked.
//!
//! Each I/O unit starts with a 32-byte header: magic, the unit's LBA, its
//! length, the job's seed, and a CRC-32C (Castagnoli, from the `crc32c`
//! crate, hardware-accelerated where the CPU has it) of the whole unit with
//! the CRC field taken as zero. The rest is pseudo-random bytes derived
//! from the LBA and the seed. A device returning zeros (a null LUN), stale
//! data of another block or of another run (`--randseed`), or corrupted
//! bytes fails the check.

use std::fmt;

use crate::workload::Rng;

const MAGIC: &[u8; 8] = b"SQCQVRFY";
/// Bytes of the header.
pub const HEADER_LEN: usize = 32;
const CRC_AT: usize = 28;

/// A read-back unit that does not hold what was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The LBA of the unit.
    pub lba: u64,
    /// What is wrong.
    pub what: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "verify: crc32c mismatch at LBA {}: {}",
            self.lba, self.what
        )
    }
}

/// Fills `buf` (at least [`HEADER_LEN`] bytes) with the content of the
/// unit at `lba`.
pub fn fill(buf: &mut [u8], lba: u64, seed: u32) {
    let mut rng = Rng::new(lba.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(seed));
    for chunk in buf[HEADER_LEN..].chunks_mut(8) {
        let bytes = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    buf[..8].copy_from_slice(MAGIC);
    buf[8..16].copy_from_slice(&lba.to_le_bytes());
    let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
    buf[16..20].copy_from_slice(&len.to_le_bytes());
    buf[20..24].copy_from_slice(&seed.to_le_bytes());
    buf[24..CRC_AT + 4].fill(0);
    let crc = crc32c::crc32c(buf);
    buf[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Checks the read-back unit `buf` that should be the one at `lba`,
/// written with `seed`. Leaves `buf`'s CRC field zeroed.
pub fn check(buf: &mut [u8], lba: u64, seed: u32) -> Result<(), Mismatch> {
    let fail = |what: String| Err(Mismatch { lba, what });
    if buf.len() < HEADER_LEN || &buf[..8] != MAGIC {
        return fail("no verify header (the block was never written, or was lost)".into());
    }
    let stored_lba = u64::from_le_bytes(buf[8..16].try_into().unwrap_or_default());
    if stored_lba != lba {
        return fail(format!("the block holds LBA {stored_lba}'s data"));
    }
    let stored = u32::from_le_bytes(buf[CRC_AT..CRC_AT + 4].try_into().unwrap_or_default());
    buf[CRC_AT..CRC_AT + 4].fill(0);
    let computed = crc32c::crc32c(buf);
    if stored != computed {
        return fail(format!(
            "stored crc32c {stored:#010x}, computed {computed:#010x}"
        ));
    }
    let written = u32::from_le_bytes(buf[20..24].try_into().unwrap_or_default());
    if written != seed {
        return fail(format!(
            "the block holds data of seed {written:#010x}, not {seed:#010x} (a write was lost)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_blocks_check_and_corruption_is_caught() {
        let mut buf = vec![0u8; 4096];
        fill(&mut buf, 77, 5);
        let pristine = buf.clone();
        assert_eq!(check(&mut buf, 77, 5), Ok(()));

        let mut other = pristine.clone();
        assert!(
            check(&mut other, 78, 5)
                .unwrap_err()
                .what
                .contains("LBA 77")
        );

        let mut stale = pristine.clone();
        assert!(check(&mut stale, 77, 6).unwrap_err().what.contains("lost"));

        let mut flipped = pristine.clone();
        flipped[1000] ^= 1;
        let err = check(&mut flipped, 77, 5).unwrap_err();
        assert_eq!(err.lba, 77);
        assert!(err.to_string().contains("crc32c mismatch at LBA 77"));

        let mut zeros = vec![0u8; 4096];
        assert!(check(&mut zeros, 77, 5).is_err());
    }

    #[test]
    fn crc32c_is_castagnoli() {
        // The standard check value of CRC-32C.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }
}
