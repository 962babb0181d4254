//! Parameter data returned by INQUIRY, READ CAPACITY and REPORT LUNS.
//! Everything comes from the device: lengths are checked, nothing is
//! trusted.

/// The standard INQUIRY data a submitter cares about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inquiry {
    /// Peripheral qualifier (3 bits).
    pub qualifier: u8,
    /// Peripheral device type (5 bits; 0 is a direct-access block device).
    pub device_type: u8,
    /// T10 vendor identification, trimmed.
    pub vendor: String,
    /// Product identification, trimmed.
    pub product: String,
    /// Product revision level, trimmed.
    pub revision: String,
}

impl Inquiry {
    /// Parses standard INQUIRY data (at least 36 bytes).
    pub fn parse(data: &[u8]) -> Option<Self> {
        let text = |range: std::ops::Range<usize>| {
            String::from_utf8_lossy(data.get(range).unwrap_or(&[]))
                .trim()
                .to_owned()
        };
        let first = *data.first()?;
        if data.len() < 36 {
            return None;
        }
        Some(Self {
            qualifier: first >> 5,
            device_type: first & 0x1f,
            vendor: text(8..16),
            product: text(16..32),
            revision: text(32..36),
        })
    }
}

/// The capacity of a logical unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Number of logical blocks.
    pub blocks: u64,
    /// Bytes per logical block.
    pub block_size: u32,
}

impl Capacity {
    /// Parses READ CAPACITY (10) data: the last LBA (0xffffffff: use the
    /// 16-byte command) and the block length.
    pub fn parse_10(data: &[u8]) -> Option<Self> {
        let last = u32::from_be_bytes(data.get(0..4)?.try_into().ok()?);
        let block_size = u32::from_be_bytes(data.get(4..8)?.try_into().ok()?);
        if last == u32::MAX {
            return None;
        }
        Some(Self {
            blocks: u64::from(last) + 1,
            block_size,
        })
    }

    /// Parses READ CAPACITY (16) data (at least 12 bytes).
    pub fn parse_16(data: &[u8]) -> Option<Self> {
        let last = u64::from_be_bytes(data.get(0..8)?.try_into().ok()?);
        let block_size = u32::from_be_bytes(data.get(8..12)?.try_into().ok()?);
        Some(Self {
            blocks: last.checked_add(1)?,
            block_size,
        })
    }

    /// The capacity in bytes, if it fits.
    pub fn bytes(&self) -> Option<u64> {
        self.blocks.checked_mul(u64::from(self.block_size))
    }
}

/// Parses REPORT LUNS data into 8-byte LUNs (only those fully present in
/// `data`, however long the device claims the list is).
pub fn parse_report_luns(data: &[u8]) -> Vec<[u8; 8]> {
    let Some(len) = data.get(0..4) else {
        return Vec::new();
    };
    let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]);
    let listed = usize::try_from(len).unwrap_or(usize::MAX) / 8;
    data.get(8..)
        .unwrap_or(&[])
        .chunks_exact(8)
        .take(listed)
        .filter_map(|lun| lun.try_into().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inquiry() {
        let mut data = [b' '; 36];
        data[0] = 0x00;
        data[8..12].copy_from_slice(b"QEMU");
        data[16..20].copy_from_slice(b"disk");
        data[32..36].copy_from_slice(b"1.0 ");
        let inq = Inquiry::parse(&data).unwrap();
        assert_eq!((inq.qualifier, inq.device_type), (0, 0));
        assert_eq!(inq.vendor, "QEMU");
        assert_eq!(inq.product, "disk");
        assert_eq!(inq.revision, "1.0");
        assert_eq!(Inquiry::parse(&data[..35]), None);
        data[0] = 0x7f;
        assert_eq!(Inquiry::parse(&data).unwrap().qualifier, 3);
    }

    #[test]
    fn capacity() {
        let c = Capacity::parse_10(&[0, 0, 0x0f, 0xff, 0, 0, 2, 0]).unwrap();
        assert_eq!((c.blocks, c.block_size), (4096, 512));
        assert_eq!(c.bytes(), Some(2 << 20));
        assert_eq!(Capacity::parse_10(&[0xff; 8]), None);
        assert_eq!(Capacity::parse_10(&[0; 7]), None);
        let mut d16 = [0u8; 32];
        d16[0..8].copy_from_slice(&0x1_0000_0000u64.to_be_bytes());
        d16[8..12].copy_from_slice(&4096u32.to_be_bytes());
        let c = Capacity::parse_16(&d16).unwrap();
        assert_eq!((c.blocks, c.block_size), (0x1_0000_0001, 4096));
        assert_eq!(Capacity::parse_16(&[0xff; 12]), None);
    }

    #[test]
    fn report_luns_trusts_nothing() {
        let mut data = vec![0, 0, 0, 16, 0, 0, 0, 0];
        data.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
        data.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(parse_report_luns(&data).len(), 2);
        // The list claims more than there is: only whole entries count.
        data[3] = 0xff;
        data.truncate(20);
        assert_eq!(parse_report_luns(&data).len(), 1);
        assert!(parse_report_luns(&[0, 0]).is_empty());
    }
}
