//! A response builder over the caller's scratch buffer that never writes
//! past it: bytes that do not fit are counted but dropped, so a header can
//! always report the full length while the data are truncated to the
//! allocation length (SPC-4).

/// Writes response data into a borrowed buffer.
#[derive(Debug)]
pub(crate) struct Response<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Response<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, len: 0 }
    }

    /// Full length of the response, including bytes that did not fit.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Writes `bytes` at `at`, dropping what does not fit.
    pub(crate) fn set(&mut self, at: usize, bytes: &[u8]) {
        if let Some(dst) = self.buf.get_mut(at..) {
            let n = dst.len().min(bytes.len());
            dst[..n].copy_from_slice(&bytes[..n]);
        }
    }

    pub(crate) fn put(&mut self, bytes: &[u8]) {
        self.set(self.len, bytes);
        self.len = self.len.saturating_add(bytes.len());
    }

    pub(crate) fn u8(&mut self, v: u8) {
        self.put(&[v]);
    }

    pub(crate) fn be16(&mut self, v: u16) {
        self.put(&v.to_be_bytes());
    }

    pub(crate) fn be32(&mut self, v: u32) {
        self.put(&v.to_be_bytes());
    }

    pub(crate) fn be64(&mut self, v: u64) {
        self.put(&v.to_be_bytes());
    }

    pub(crate) fn zeros(&mut self, n: usize) {
        if let Some(dst) = self.buf.get_mut(self.len..) {
            let m = dst.len().min(n);
            dst[..m].fill(0);
        }
        self.len = self.len.saturating_add(n);
    }

    /// Number of bytes to transfer: the response truncated to the
    /// allocation length and to the buffer.
    pub(crate) fn finish(self, alloc_len: usize) -> usize {
        self.len.min(alloc_len).min(self.buf.len())
    }
}

/// Saturating conversion for length fields.
pub(crate) fn len16(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

/// Saturating conversion for length fields.
pub(crate) fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_does_not_fit() {
        let mut buf = [0xaau8; 5];
        let mut r = Response::new(&mut buf);
        r.be32(0x0102_0304);
        r.be16(0x0506);
        r.zeros(3);
        assert_eq!(r.len(), 9);
        r.set(0, &[9]);
        assert_eq!(r.finish(100), 5);
        assert_eq!(buf, [9, 2, 3, 4, 5]);
    }

    #[test]
    fn finish_honours_allocation_length() {
        let mut buf = [0u8; 64];
        let mut r = Response::new(&mut buf);
        r.be64(1);
        assert_eq!(r.finish(3), 3);
    }

    #[test]
    fn set_past_the_end_is_dropped() {
        let mut buf = [0u8; 2];
        let mut r = Response::new(&mut buf);
        r.set(10, &[1, 2, 3]);
        r.u8(7);
        assert_eq!(r.finish(usize::MAX), 1);
        assert_eq!(buf, [7, 0]);
    }
}
