//! Where the doorbells live and which values in them make sense.
//!
//! The doorbells need no new transport or vhost-user message: like the
//! `used_event`/`avail_event` fields of `VIRTIO_RING_F_EVENT_IDX`, their place
//! is defined relative to ring addresses both sides already exchanged. The
//! SQ doorbell starts at the first 128-byte boundary after the used ring
//! (counting its trailing `avail_event` field whether or not EVENT_IDX is
//! negotiated) and the CQ doorbell follows it:
//!
//! ```text
//! sq = align_up(used + 6 + 8 * queue_size, 128)
//! cq = sq + 64
//! ```
//!
//! Aligning the 128-byte pair to 128 keeps it inside one page, so a device
//! never has to find the two doorbells in two memory regions.
//!
//! A packed virtqueue (spec section 10.1) has its doorbells after its
//! Device Area, the 4-byte device event suppression structure, instead:
//!
//! ```text
//! sq = align_up(device_area + 4, 128)
//! cq = sq + 64
//! ```
//!
//! Both sides call [`doorbell_location`] (or [`packed_doorbell_location`]);
//! the device treats every error they return as a broken queue, never as a
//! reason to guess.

use thiserror::Error;

/// Size in bytes of one doorbell (one cache line).
pub const DOORBELL_SIZE: u64 = 64;
/// Alignment in bytes of each doorbell.
pub const DOORBELL_ALIGN: u64 = 64;
/// Alignment in bytes of the two-doorbell area (so it never crosses a page).
pub const DOORBELL_AREA_ALIGN: u64 = 128;
/// Size in bytes of the area that holds both doorbells of a queue.
pub const DOORBELL_AREA_SIZE: u64 = 2 * DOORBELL_SIZE;
/// Largest split virtqueue size the virtio specification allows.
pub const MAX_QUEUE_SIZE: u16 = 32768;

/// Guest-physical addresses of a split virtqueue's three parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingAddrs {
    /// The descriptor table (16 bytes per entry).
    pub desc: u64,
    /// The available (driver) ring.
    pub avail: u64,
    /// The used (device) ring.
    pub used: u64,
}

/// Guest-physical addresses of a packed virtqueue's three areas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackedAddrs {
    /// The descriptor ring (16 bytes per descriptor).
    pub desc: u64,
    /// The Driver Area: the driver event suppression structure (4 bytes).
    pub driver: u64,
    /// The Device Area: the device event suppression structure (4 bytes).
    pub device: u64,
}

/// Where the two doorbells of one virtqueue are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DoorbellLocation {
    /// Guest-physical address of the SQ doorbell (driver produces).
    pub sq: u64,
    /// Guest-physical address of the CQ doorbell (device produces).
    pub cq: u64,
}

impl DoorbellLocation {
    /// First address of the 128-byte doorbell area.
    pub fn start(&self) -> u64 {
        self.sq
    }

    /// One past the last byte of the doorbell area.
    pub fn end(&self) -> u64 {
        // Cannot overflow: `doorbell_location` checked `sq + 128`.
        self.sq + DOORBELL_AREA_SIZE
    }
}

/// Why a doorbell location cannot be computed or used.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum LayoutError {
    /// The queue size is zero, not a power of two, or above 32768.
    #[error("invalid queue size {0}: must be a power of two in 1..=32768")]
    QueueSize(u16),
    /// A packed queue's size is zero or above 32768.
    #[error("invalid packed queue size {0}: must be in 1..=32768")]
    PackedQueueSize(u16),
    /// A ring address violates the alignment its layout requires (split:
    /// descriptor table 16, avail ring 2, used ring 4; packed: descriptor
    /// ring 16, driver and device areas 4).
    #[error("{ring} ring address {addr:#x} is not {align}-byte aligned")]
    Misaligned {
        /// Which ring: "descriptor", "avail" or "used"; packed,
        /// "descriptor", "driver area" or "device area".
        ring: &'static str,
        /// The offending address.
        addr: u64,
        /// The alignment it must have.
        align: u64,
    },
    /// Computing the doorbell area (or a ring's end) overflows 64 bits.
    #[error("doorbell area after used ring at {used:#x} overflows the address space")]
    Overflow {
        /// The used ring (packed: Device Area) address the computation
        /// started from.
        used: u64,
    },
    /// The doorbell area overlaps the descriptor table or the avail ring
    /// (packed: the descriptor ring or the Driver Area).
    #[error("doorbell area {start:#x}..{end:#x} overlaps the {ring} ring")]
    Overlap {
        /// Which ring it overlaps: "descriptor", "avail" or "driver area".
        ring: &'static str,
        /// First byte of the doorbell area.
        start: u64,
        /// One past the last byte of the doorbell area.
        end: u64,
    },
}

/// Checks a queue size the way the split ring requires.
pub fn check_queue_size(queue_size: u16) -> Result<(), LayoutError> {
    if queue_size == 0 || !queue_size.is_power_of_two() || queue_size > MAX_QUEUE_SIZE {
        return Err(LayoutError::QueueSize(queue_size));
    }
    Ok(())
}

/// Computes where the SQ and CQ doorbells of a queue are.
///
/// Checks the queue size, the rings' alignment, 64-bit overflow of every
/// end address, and that the doorbell area overlaps neither the descriptor
/// table nor the avail ring. (It starts after the used ring by
/// construction.) Whether the area lies inside guest memory is for the
/// caller, which owns the memory map, to check.
pub fn doorbell_location(
    ring: RingAddrs,
    queue_size: u16,
) -> Result<DoorbellLocation, LayoutError> {
    check_queue_size(queue_size)?;
    check_aligned([
        ("descriptor", ring.desc, 16),
        ("avail", ring.avail, 2),
        ("used", ring.used, 4),
    ])?;
    let n = u64::from(queue_size);
    let overflow = LayoutError::Overflow { used: ring.used };
    // 4-byte header, 8 bytes per used element, 2-byte avail_event.
    let used_end = ring.used.checked_add(6 + 8 * n).ok_or(overflow)?;
    place_after(
        used_end,
        overflow,
        [
            ("descriptor", ring.desc, 16 * n),
            ("avail", ring.avail, 6 + 2 * n),
        ],
    )
}

/// Computes where the SQ and CQ doorbells of a packed virtqueue are (spec
/// section 10.1): the first 128-byte boundary after the Device Area.
///
/// Checks the queue size (any value in 1..=32768), the areas' alignment,
/// 64-bit overflow, and that the doorbell area overlaps neither the
/// descriptor ring nor the Driver Area. (It starts after the Device Area
/// by construction.) Whether the area lies inside guest memory is for the
/// caller to check.
pub fn packed_doorbell_location(
    ring: PackedAddrs,
    queue_size: u16,
) -> Result<DoorbellLocation, LayoutError> {
    if queue_size == 0 || queue_size > MAX_QUEUE_SIZE {
        return Err(LayoutError::PackedQueueSize(queue_size));
    }
    check_aligned([
        ("descriptor", ring.desc, 16),
        ("driver area", ring.driver, 4),
        ("device area", ring.device, 4),
    ])?;
    let overflow = LayoutError::Overflow { used: ring.device };
    let device_end = ring.device.checked_add(4).ok_or(overflow)?;
    place_after(
        device_end,
        overflow,
        [
            ("descriptor", ring.desc, 16 * u64::from(queue_size)),
            ("driver area", ring.driver, 4),
        ],
    )
}

/// The doorbell area at the first 128-byte boundary at or after `after`
/// (the end of the area the doorbells follow), checked against 64-bit
/// overflow (`overflow`) and against overlapping any of `others`, each
/// `(name, start, length)`.
fn place_after(
    after: u64,
    overflow: LayoutError,
    others: [(&'static str, u64, u64); 2],
) -> Result<DoorbellLocation, LayoutError> {
    let sq = align_up(after, DOORBELL_AREA_ALIGN).ok_or(overflow)?;
    let cq = sq.checked_add(DOORBELL_SIZE).ok_or(overflow)?;
    let end = cq.checked_add(DOORBELL_SIZE).ok_or(overflow)?;
    for (name, start, len) in others {
        let stop = start.checked_add(len).ok_or(overflow)?;
        if start < end && sq < stop {
            return Err(LayoutError::Overlap {
                ring: name,
                start: sq,
                end,
            });
        }
    }
    Ok(DoorbellLocation { sq, cq })
}

/// [`LayoutError::Misaligned`] for the first of `(name, address,
/// alignment)` whose address is not a multiple of its alignment.
fn check_aligned(areas: [(&'static str, u64, u64); 3]) -> Result<(), LayoutError> {
    match areas
        .into_iter()
        .find(|&(_, addr, align)| addr % align != 0)
    {
        Some((ring, addr, align)) => Err(LayoutError::Misaligned { ring, addr, align }),
        None => Ok(()),
    }
}

fn align_up(addr: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    Some(addr.checked_add(align - 1)? & !(align - 1))
}

/// A doorbell index that no correct peer could have written.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[error(
    "doorbell index {value} is {distance} entries from ring position {position} (queue size {queue_size})"
)]
pub struct NonsenseIndex {
    /// The value read from the doorbell.
    pub value: u16,
    /// The reader's own ring position it was compared with.
    pub position: u16,
    /// Signed distance `value - position` in 16-bit ring arithmetic.
    pub distance: i32,
    /// The queue size.
    pub queue_size: u16,
}

/// Validates a doorbell index against the reader's own ring position.
///
/// A doorbell is a hint; work is always taken from the ring. Still, a
/// correct producer's index is never further than `queue_size` entries
/// ahead of, nor (because it is published after the ring index and read
/// racily) behind, the position the consumer has reached on the ring.
/// Anything further is bad input: the device marks the queue broken, the
/// driver reports a device error. Returns the signed distance.
pub fn check_index(value: u16, position: u16, queue_size: u16) -> Result<i32, NonsenseIndex> {
    let distance = i32::from(value.wrapping_sub(position).cast_signed());
    if distance.unsigned_abs() > u32::from(queue_size) {
        return Err(NonsenseIndex {
            value,
            position,
            distance,
            queue_size,
        });
    }
    Ok(distance)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rings(used: u64) -> RingAddrs {
        RingAddrs {
            desc: 0x1000,
            avail: 0x2000,
            used,
        }
    }

    #[test]
    fn location_follows_used_ring_and_avail_event() {
        // 256 entries: used ring is 6 + 2048 = 2054 bytes, ends at 0x3806,
        // next 128-byte boundary 0x3880 (the spec's worked example).
        let loc = doorbell_location(rings(0x3000), 256).unwrap();
        assert_eq!(
            loc,
            DoorbellLocation {
                sq: 0x3880,
                cq: 0x38c0
            }
        );
        assert_eq!(loc.end(), 0x3900);
        assert_eq!(loc.sq % DOORBELL_ALIGN, 0);
        assert_eq!(loc.cq % DOORBELL_ALIGN, 0);
    }

    #[test]
    fn location_is_the_first_boundary_past_the_used_ring() {
        for n in [1u16, 2, 4, 64, 1024, 32768] {
            for used in (0x10_0000u64..0x10_0100).step_by(4) {
                let used_end = used + 6 + 8 * u64::from(n);
                let loc = doorbell_location(
                    RingAddrs {
                        desc: 0,
                        avail: 0x8000,
                        used,
                    },
                    n,
                )
                .unwrap();
                assert_eq!(loc.sq % 128, 0);
                assert!(loc.sq >= used_end, "n={n} used={used:#x}");
                assert!(loc.sq - used_end < 128, "n={n} used={used:#x}");
                assert_eq!(loc.sq / 4096, (loc.end() - 1) / 4096, "area crosses a page");
                assert_eq!(loc.cq, loc.sq + 64);
            }
        }
    }

    #[test]
    fn queue_size_must_be_power_of_two_up_to_32768() {
        for bad in [0u16, 3, 100, 32769, u16::MAX] {
            assert_eq!(
                doorbell_location(rings(0x3000), bad),
                Err(LayoutError::QueueSize(bad))
            );
        }
        assert!(doorbell_location(rings(0x100000), 32768).is_ok());
    }

    #[test]
    fn misaligned_rings_are_rejected() {
        let r = RingAddrs {
            desc: 0x1008,
            avail: 0x2000,
            used: 0x3000,
        };
        assert!(matches!(
            doorbell_location(r, 8),
            Err(LayoutError::Misaligned {
                ring: "descriptor",
                ..
            })
        ));
        let r = RingAddrs {
            desc: 0x1000,
            avail: 0x2001,
            used: 0x3000,
        };
        assert!(matches!(
            doorbell_location(r, 8),
            Err(LayoutError::Misaligned { ring: "avail", .. })
        ));
        let r = RingAddrs {
            desc: 0x1000,
            avail: 0x2000,
            used: 0x3002,
        };
        assert!(matches!(
            doorbell_location(r, 8),
            Err(LayoutError::Misaligned { ring: "used", .. })
        ));
    }

    #[test]
    fn overflow_near_top_of_address_space() {
        let top = u64::MAX - 3; // 4-aligned
        assert_eq!(
            doorbell_location(
                RingAddrs {
                    desc: 0,
                    avail: 0x1000,
                    used: top
                },
                8
            ),
            Err(LayoutError::Overflow { used: top })
        );
        // The used ring fits but the doorbell area does not.
        let used = !0x7f_u64 - 0x40;
        assert!(matches!(
            doorbell_location(
                RingAddrs {
                    desc: 0,
                    avail: 0x1000,
                    used
                },
                1
            ),
            Err(LayoutError::Overflow { .. })
        ));
        // A descriptor table whose end overflows is reported too.
        assert!(matches!(
            doorbell_location(
                RingAddrs {
                    desc: !0xf_u64,
                    avail: 0x1000,
                    used: 0x3000
                },
                8
            ),
            Err(LayoutError::Overflow { .. })
        ));
    }

    #[test]
    fn overlap_with_other_rings_is_rejected() {
        // Avail ring placed right where the doorbells would go.
        let r = RingAddrs {
            desc: 0x1000,
            avail: 0x3880,
            used: 0x3000,
        };
        assert!(matches!(
            doorbell_location(r, 256),
            Err(LayoutError::Overlap { ring: "avail", .. })
        ));
        let r = RingAddrs {
            desc: 0x38c0,
            avail: 0x2000,
            used: 0x3000,
        };
        assert!(matches!(
            doorbell_location(r, 256),
            Err(LayoutError::Overlap {
                ring: "descriptor",
                ..
            })
        ));
        // Touching but not overlapping is fine.
        let r = RingAddrs {
            desc: 0x3900,
            avail: 0x2000,
            used: 0x3000,
        };
        assert!(doorbell_location(r, 256).is_ok());
    }

    fn packed(desc: u64, driver: u64, device: u64) -> PackedAddrs {
        PackedAddrs {
            desc,
            driver,
            device,
        }
    }

    #[test]
    fn packed_location_follows_the_device_area() {
        // A Device Area at the start of a 128-byte aligned allocation: the
        // doorbells at offset 128 of it (spec 10.1).
        let loc = packed_doorbell_location(packed(0x1000, 0x2000, 0x3000), 100).unwrap();
        assert_eq!(
            loc,
            DoorbellLocation {
                sq: 0x3080,
                cq: 0x30c0
            }
        );
        // The first boundary at or past its end, whatever the size.
        for device in (0x3000u64..0x3100).step_by(4) {
            let loc = packed_doorbell_location(packed(0x1000, 0x2000, device), 3).unwrap();
            assert_eq!(loc.sq % 128, 0);
            assert!(loc.sq >= device + 4 && loc.sq - (device + 4) < 128);
        }
    }

    #[test]
    fn packed_sizes_need_not_be_powers_of_two() {
        for n in [1u16, 3, 100, 32767, 32768] {
            assert!(packed_doorbell_location(packed(0x10_0000, 0x1000, 0x2000), n).is_ok());
        }
        for bad in [0u16, 32769, u16::MAX] {
            assert_eq!(
                packed_doorbell_location(packed(0x10_0000, 0x1000, 0x2000), bad),
                Err(LayoutError::PackedQueueSize(bad))
            );
        }
    }

    #[test]
    fn packed_areas_are_checked() {
        for (addrs, what) in [
            (packed(0x1008, 0x2000, 0x3000), "descriptor"),
            (packed(0x1000, 0x2002, 0x3000), "driver area"),
            (packed(0x1000, 0x2000, 0x3002), "device area"),
        ] {
            assert!(
                matches!(
                    packed_doorbell_location(addrs, 8),
                    Err(LayoutError::Misaligned { ring, .. }) if ring == what
                ),
                "{what}"
            );
        }
        // The descriptor ring (16 * 8 bytes) where the doorbells would go.
        assert!(matches!(
            packed_doorbell_location(packed(0x3040, 0x2000, 0x3000), 8),
            Err(LayoutError::Overlap {
                ring: "descriptor",
                ..
            })
        ));
        // Touching the end of the doorbell area is fine.
        assert!(packed_doorbell_location(packed(0x3100, 0x2000, 0x3000), 8).is_ok());
        assert!(matches!(
            packed_doorbell_location(packed(0x1000, 0x30fc, 0x3000), 8),
            Err(LayoutError::Overlap {
                ring: "driver area",
                ..
            })
        ));
        assert!(matches!(
            packed_doorbell_location(packed(0x1000, 0x2000, u64::MAX - 3), 8),
            Err(LayoutError::Overflow { .. })
        ));
    }

    #[test]
    fn index_check_accepts_wrap_around() {
        assert_eq!(check_index(3, 65533, 8), Ok(6));
        assert_eq!(check_index(65533, 3, 8), Ok(-6));
        assert_eq!(check_index(100, 100, 8), Ok(0));
        assert_eq!(check_index(108, 100, 8), Ok(8));
        assert_eq!(check_index(92, 100, 8), Ok(-8));
    }

    #[test]
    fn index_check_rejects_nonsense() {
        let e = check_index(109, 100, 8).unwrap_err();
        assert_eq!(e.distance, 9);
        assert!(check_index(91, 100, 8).is_err());
        assert!(check_index(0x8000, 0, 256).is_err());
        // Exhaustive over one position: exactly 2 * qsize + 1 values are valid.
        let valid = (0..=u16::MAX)
            .filter(|&v| check_index(v, 40000, 16).is_ok())
            .count();
        assert_eq!(valid, 33);
    }
}
