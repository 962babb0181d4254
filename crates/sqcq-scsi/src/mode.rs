//! MODE SENSE and MODE SELECT (SPC-4): the caching, control
//! and informational exceptions control pages. Only WCE is changeable.

use crate::cdb::PageControl;
use crate::config::LuConfig;
use crate::error::ScsiError;
use crate::resp::Response;
use crate::sense::top_bit;

const CACHING: u8 = 0x08;
const CONTROL: u8 = 0x0a;
const INFORMATIONAL_EXCEPTIONS: u8 = 0x1c;
const ALL_PAGES: u8 = 0x3f;
const SUPPORTED: [u8; 3] = [CACHING, CONTROL, INFORMATIONAL_EXCEPTIONS];

/// The caching page's WCE bit (byte 2).
const WCE: u8 = 0x04;

/// A MODE SENSE request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SenseRequest {
    pub(crate) long: bool,
    pub(crate) dbd: bool,
    pub(crate) llbaa: bool,
    pub(crate) control: PageControl,
    pub(crate) page: u8,
    pub(crate) subpage: u8,
}

/// Longest mode page (caching).
const MAX_PAGE: usize = 20;

/// One mode page with its header, in a fixed buffer: building a response
/// allocates nothing.
#[derive(Clone, Copy, Debug)]
struct Page {
    bytes: [u8; MAX_PAGE],
    len: usize,
}

impl Page {
    fn as_slice(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or(&self.bytes)
    }
}

/// Mode page `code` as `control` asks (`Saved` is refused before this).
fn page(code: u8, control: PageControl, current_wce: bool, default_wce: bool) -> Page {
    let changeable = control == PageControl::Changeable;
    let mut p = [0u8; MAX_PAGE];
    let len = match code {
        CACHING => {
            let wce = match control {
                PageControl::Current => current_wce,
                PageControl::Default | PageControl::Saved => default_wce,
                PageControl::Changeable => true,
            };
            p[0] = CACHING;
            p[1] = 0x12;
            if wce {
                p[2] = WCE;
            }
            20
        }
        CONTROL => {
            p[0] = CONTROL;
            p[1] = 0x0a;
            if !changeable {
                p[3] = 0x10; // QUEUE ALGORITHM MODIFIER 1: unrestricted reordering
                p[8] = 0xff; // BUSY TIMEOUT PERIOD: unlimited
                p[9] = 0xff;
            }
            12
        }
        _ => {
            p[0] = INFORMATIONAL_EXCEPTIONS;
            p[1] = 0x0a;
            if !changeable {
                p[2] = 0x08; // DEXCPT: no informational exceptions reported
            }
            12
        }
    };
    Page { bytes: p, len }
}

/// What the mode pages of a unit report: its configuration (the
/// defaults), its capacity (the block descriptor) and its current WCE.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Parameters<'a> {
    pub(crate) config: &'a LuConfig,
    pub(crate) blocks: u64,
    pub(crate) write_cache: bool,
}

impl Parameters<'_> {
    fn page(&self, code: u8, control: PageControl) -> Page {
        page(code, control, self.write_cache, self.config.write_cache)
    }

    fn device_specific(&self) -> u8 {
        // WP when read-only; DPOFUA: DPO and FUA are supported.
        (if self.config.read_only { 0x80 } else { 0 }) | 0x10
    }

    /// MODE SENSE(6) or (10).
    pub(crate) fn sense(&self, req: SenseRequest, r: &mut Response<'_>) -> Result<(), ScsiError> {
        if req.control == PageControl::Saved {
            return Err(ScsiError::SavingParametersNotSupported);
        }
        let codes: &[u8] = match req.page {
            ALL_PAGES => &SUPPORTED,
            p => SUPPORTED
                .iter()
                .position(|&c| c == p)
                .and_then(|i| SUPPORTED.get(i..=i))
                .ok_or(ScsiError::cdb_field(2, Some(5)))?,
        };
        // No subpages: subpage 0, or FFh (all subpages) which adds nothing.
        if req.subpage != 0 && req.subpage != 0xff {
            return Err(ScsiError::cdb_field(3, Some(7)));
        }
        let long_lba = req.long && req.llbaa;
        let bd_len: u8 = match (req.dbd, long_lba) {
            (true, _) => 0,
            (false, false) => 8,
            (false, true) => 16,
        };
        if req.long {
            r.be16(0); // MODE DATA LENGTH, patched below
            r.u8(0x00);
            r.u8(self.device_specific());
            r.u8(u8::from(long_lba && bd_len != 0)); // LONGLBA
            r.u8(0x00);
            r.be16(u16::from(bd_len));
        } else {
            r.u8(0);
            r.u8(0x00);
            r.u8(self.device_specific());
            r.u8(bd_len);
        }
        let blocks = self.blocks;
        match bd_len {
            8 => {
                r.be32(u32::try_from(blocks).unwrap_or(u32::MAX));
                r.u8(0);
                r.put(&self.config.block_size.to_be_bytes()[1..]);
            }
            16 => {
                r.be64(blocks);
                r.zeros(4);
                r.be32(self.config.block_size);
            }
            _ => {}
        }
        for &c in codes {
            r.put(self.page(c, req.control).as_slice());
        }
        // MODE DATA LENGTH excludes itself.
        let total = r.len();
        if req.long {
            let n = u16::try_from(total - 2).unwrap_or(u16::MAX);
            r.set(0, &n.to_be_bytes());
        } else {
            r.set(0, &[u8::try_from(total - 1).unwrap_or(u8::MAX)]);
        }
        Ok(())
    }

    /// Checks the parameter list of MODE SELECT(6) or (10); returns the
    /// WCE it asks for, if it sent the caching page (the caller changes
    /// it: nothing else is changeable).
    pub(crate) fn select(
        &self,
        long: bool,
        param_len: u16,
        data_out: &[u8],
    ) -> Result<Option<bool>, ScsiError> {
        let data = data_out
            .get(..usize::from(param_len))
            .ok_or(ScsiError::ParameterListLength)?;
        if data.is_empty() {
            return Ok(None);
        }
        let header = if long { 8 } else { 4 };
        let hdr = data.get(..header).ok_or(ScsiError::ParameterListLength)?;
        let (bd_len, bd_len_at, long_lba) = if long {
            (
                usize::from(u16::from_be_bytes([hdr[6], hdr[7]])),
                6,
                hdr[4] & 0x01 != 0,
            )
        } else {
            (usize::from(hdr[3]), 3, false)
        };
        if bd_len != 0 {
            let want = if long_lba { 16 } else { 8 };
            if bd_len != want {
                return Err(ScsiError::parameter_field(bd_len_at, Some(7)));
            }
            let bd = data
                .get(header..header + bd_len)
                .ok_or(ScsiError::ParameterListLength)?;
            self.check_block_descriptor(bd, header, long_lba)?;
        }
        self.check_pages(data, header + bd_len)
    }

    /// The block descriptor may only restate the geometry (a block count of
    /// zero means "unchanged").
    fn check_block_descriptor(
        &self,
        bd: &[u8],
        at: usize,
        long_lba: bool,
    ) -> Result<(), ScsiError> {
        let at16 = |i: usize| u16::try_from(at + i).unwrap_or(u16::MAX);
        let blocks = self.blocks;
        let (count_ok, size) = if long_lba {
            let mut n = [0u8; 8];
            n.copy_from_slice(&bd[0..8]);
            let n = u64::from_be_bytes(n);
            let s = u32::from_be_bytes([bd[12], bd[13], bd[14], bd[15]]);
            (n == 0 || n == blocks, s)
        } else {
            let n = u32::from_be_bytes([bd[0], bd[1], bd[2], bd[3]]);
            let s = u32::from_be_bytes([0, bd[5], bd[6], bd[7]]);
            (n == 0 || n == u32::try_from(blocks).unwrap_or(u32::MAX), s)
        };
        if !count_ok {
            return Err(ScsiError::parameter_field(at16(0), Some(7)));
        }
        if size != self.config.block_size {
            let off = if long_lba { 12 } else { 5 };
            return Err(ScsiError::parameter_field(at16(off), Some(7)));
        }
        Ok(())
    }

    /// Checks every page against the current values and the changeable
    /// mask; returns the requested WCE, if the caching page was sent.
    fn check_pages(&self, data: &[u8], mut p: usize) -> Result<Option<bool>, ScsiError> {
        let at = |i: usize| u16::try_from(i).unwrap_or(u16::MAX);
        let mut wce = None;
        while p < data.len() {
            let head = data.get(p..p + 2).ok_or(ScsiError::ParameterListLength)?;
            let (code, len) = (head[0] & 0x3f, usize::from(head[1]));
            if head[0] & 0x40 != 0 {
                // SPF: sub-page format; there are no subpages.
                return Err(ScsiError::parameter_field(at(p), Some(6)));
            }
            if !SUPPORTED.contains(&code) {
                return Err(ScsiError::parameter_field(at(p), Some(5)));
            }
            let sent = data
                .get(p..p + 2 + len)
                .ok_or(ScsiError::ParameterListLength)?;
            let current = self.page(code, PageControl::Current);
            let current = current.as_slice();
            let mask = self.page(code, PageControl::Changeable);
            let mask = mask.as_slice();
            if sent.len() != current.len() {
                return Err(ScsiError::parameter_field(at(p + 1), Some(7)));
            }
            for (i, ((&s, &c), &m)) in sent.iter().zip(current).zip(mask).enumerate().skip(2) {
                let diff = (s ^ c) & !m;
                if diff != 0 {
                    return Err(ScsiError::parameter_field(at(p + i), Some(top_bit(diff))));
                }
            }
            if code == CACHING {
                wce = Some(sent[2] & WCE != 0);
            }
            p += 2 + len;
        }
        Ok(wce)
    }
}

#[cfg(test)]
#[path = "mode_tests.rs"]
mod tests;
