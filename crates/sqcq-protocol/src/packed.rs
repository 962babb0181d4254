//! Positions in a packed virtqueue (virtio 1.2, 2.8): an offset below the
//! queue size and the wrap counter of the lap it is on, and their 16-bit
//! form, which the packed ring's event suppression structures, its
//! notification data and, with VIRTIO_F_SQCQ_POLL, the doorbells' `idx`
//! use (`docs/spec/virtio-sqcq.md`, section 10.2). Both sides of a packed
//! ring count with it: the device (`sqcq-target`) and the driver
//! (`sqcq-driver`).

/// The wrap counter's bit in an encoded position
/// (VRING_PACKED_EVENT_F_WRAP_CTR).
const WRAP: u16 = 1 << 15;

/// A position in the descriptor ring: an offset below the queue size and
/// the wrap counter of the lap it is on. Both sides start at offset 0
/// with the counter set, and flip it each time they pass the ring's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Position {
    off: u16,
    wrap: bool,
}

impl Position {
    /// Where both sides start.
    pub const START: Position = Position { off: 0, wrap: true };

    /// The position `off` on the lap with wrap counter `wrap`.
    pub const fn new(off: u16, wrap: bool) -> Self {
        Position { off, wrap }
    }

    /// Offset in the ring.
    pub const fn off(self) -> u16 {
        self.off
    }

    /// Wrap counter of its lap.
    pub const fn wrap(self) -> bool {
        self.wrap
    }

    /// The 16-bit form: offset in bits 0-14, wrap counter in bit 15.
    pub const fn encode(self) -> u16 {
        self.off | if self.wrap { WRAP } else { 0 }
    }

    /// The position a 16-bit form names in a ring of `size`, if its
    /// offset lies in the ring.
    pub const fn decode(v: u16, size: u16) -> Option<Self> {
        let off = v & !WRAP;
        if off >= size {
            return None;
        }
        Some(Position {
            off,
            wrap: v & WRAP != 0,
        })
    }

    /// The position `n` descriptors on (`n <= size`).
    #[must_use]
    pub fn advance(self, n: u16, size: u16) -> Self {
        debug_assert!(n <= size && self.off < size);
        // off < size and n <= size: past the end, off - (size - n) is
        // what is left of the lap beyond it.
        let (off, wrapped) = if self.off < size - n {
            (self.off + n, false)
        } else {
            (self.off - (size - n), true)
        };
        Position {
            off,
            wrap: self.wrap ^ wrapped,
        }
    }

    /// Where it lies on a circle of two laps (`0..2 * size`).
    fn on_two_laps(self, size: u16) -> u32 {
        u32::from(self.off) + if self.wrap { 0 } else { u32::from(size) }
    }

    /// How many descriptors `later` lies ahead of `self`, counted on a
    /// circle of two laps (`0..2 * size`): the distance when `later` was
    /// reached by advancing at most a lap.
    pub fn ahead(self, later: Position, size: u16) -> u32 {
        let laps = 2 * u32::from(size);
        (later.on_two_laps(size) + laps - self.on_two_laps(size)) % laps
    }
}

/// The vhost-user vring base of a packed ring (VHOST_USER_SET_VRING_BASE
/// and GET_VRING_BASE, as QEMU sends and reads it): the next available
/// position in bits 0-15, the next used position in bits 16-31, each in
/// its 16-bit form.
pub fn encode_base(avail: Position, used: Position) -> u32 {
    u32::from(avail.encode()) | u32::from(used.encode()) << 16
}

/// The two positions of a vring base, if both lie in a ring of `size`.
pub fn decode_base(base: u32, size: u16) -> Option<(Position, Position)> {
    let [a0, a1, u0, u1] = base.to_le_bytes();
    let avail = Position::decode(u16::from_le_bytes([a0, a1]), size)?;
    let used = Position::decode(u16::from_le_bytes([u0, u1]), size)?;
    Some((avail, used))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_advance_wrap_and_encode_as_the_specification_says() {
        let size = 5;
        let mut p = Position::START;
        let mut seen = std::vec::Vec::new();
        for _ in 0..12 {
            seen.push((p.off(), p.wrap()));
            p = p.advance(1, size);
        }
        assert_eq!(
            seen,
            [
                (0, true),
                (1, true),
                (2, true),
                (3, true),
                (4, true),
                (0, false),
                (1, false),
                (2, false),
                (3, false),
                (4, false),
                (0, true),
                (1, true)
            ]
        );
        assert_eq!(
            Position::new(3, true).advance(5, 5),
            Position::new(3, false)
        );
        assert_eq!(
            Position::new(4, false).advance(2, 5),
            Position::new(1, true)
        );
        assert_eq!(Position::new(3, true).encode(), 0x8003);
        assert_eq!(Position::new(3, false).encode(), 3);
        assert_eq!(Position::decode(0x8004, 5), Some(Position::new(4, true)));
        assert_eq!(Position::decode(0x8005, 5), None);
        assert_eq!(Position::new(4, true).ahead(Position::new(1, false), 5), 2);
        assert_eq!(Position::new(1, false).ahead(Position::new(4, true), 5), 8);
        assert_eq!(Position::new(2, true).ahead(Position::new(2, true), 5), 0);
        assert_eq!(Position::new(2, true).ahead(Position::new(2, false), 5), 5);
        let base = encode_base(Position::new(2, false), Position::new(7, true));
        assert_eq!(base, 0x8007_0002);
        assert_eq!(
            decode_base(base, 8),
            Some((Position::new(2, false), Position::new(7, true)))
        );
        assert_eq!(decode_base(base, 7), None);
    }
}
