//! Keeping alive the memory maps that requests in flight point into, with
//! a count per map instead of a reference per request.
//!
//! A request handed to a backstore carries iovecs into guest memory, so
//! the map they point into must stay mapped until the request completes,
//! even if the control thread swapped in another map meanwhile. An `Arc`
//! clone per request does that, but each clone and each drop is a locked
//! instruction, a full barrier on x86: the drop at completion came right
//! after the response and used-ring stores to lines the driver polls, and
//! waited for them to leave the store buffer. Both showed in the worker's
//! profile at depth 32 (docs/benchmarks.md, "Target: memory-map pins
//! instead of an `Arc` per request").
//!
//! [`MapPins`] holds one `Arc` per map with requests in flight and counts
//! the requests with plain integers. The map of the latest pin stays held
//! while no request is in flight, so that a queue at work takes no
//! reference at all; it is let go when a request is pinned to another map
//! and by [`MapPins::release_idle`], which the queue calls when the memory
//! map changes. A map other than the latest goes with its last request,
//! as with a reference per request.
//!
//! Nothing in vm-memory or the rust-vmm crates counts this way: a
//! `GuestMemoryAtomic` guard is itself an `Arc`.

use std::sync::Arc;

use crate::runtime::guest::GuestMem;

/// A request's hold on its memory map, given back with
/// [`MapPins::unpin`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MapPin(*const GuestMem);

// SAFETY: the pointer is only compared, never dereferenced.
unsafe impl Send for MapPin {}

/// The memory maps of one queue's requests in flight: usually one, two
/// for a while after a memory table change. The last entry is the map of
/// the latest pin.
#[derive(Debug, Default)]
pub(crate) struct MapPins {
    maps: Vec<(Arc<GuestMem>, u32)>,
}

impl MapPins {
    /// Keeps `mem` mapped until the pin is given back.
    #[inline]
    pub(crate) fn pin(&mut self, mem: &Arc<GuestMem>) -> MapPin {
        match self.maps.last_mut() {
            Some((m, n)) if Arc::ptr_eq(m, mem) => *n += 1,
            _ => self.pin_new(mem),
        }
        MapPin(Arc::as_ptr(mem))
    }

    /// A pin to a map other than the latest: it becomes the latest; the
    /// former latest goes if nothing points into it.
    #[cold]
    fn pin_new(&mut self, mem: &Arc<GuestMem>) {
        if let Some(i) = self.maps.iter().position(|(m, _)| Arc::ptr_eq(m, mem)) {
            let entry = self.maps.remove(i);
            self.maps.push(entry);
        } else {
            self.maps.push((Arc::clone(mem), 0));
        }
        let latest = self.maps.len() - 1;
        let mut i = 0;
        self.maps.retain(|(_, n)| {
            let keep = *n > 0 || i == latest;
            i += 1;
            keep
        });
        if let Some((_, n)) = self.maps.last_mut() {
            *n += 1;
        }
    }

    /// Gives a pin back; a map other than the latest goes with its last
    /// pin. A pin this set did not give out is ignored.
    #[inline]
    pub(crate) fn unpin(&mut self, pin: MapPin) {
        let Some(i) = self
            .maps
            .iter()
            .rposition(|(m, _)| std::ptr::eq(Arc::as_ptr(m), pin.0))
        else {
            return;
        };
        let n = &mut self.maps[i].1;
        *n = n.saturating_sub(1);
        if *n == 0 && i + 1 < self.maps.len() {
            self.maps.remove(i);
        }
    }

    /// Lets go of every map no request points into.
    pub(crate) fn release_idle(&mut self) {
        self.maps.retain(|(_, n)| *n > 0);
    }

    /// How many maps are held.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.maps.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestAddress;

    fn map() -> Arc<GuestMem> {
        Arc::new(crate::runtime::guest::test_memory(&[(
            GuestAddress(0),
            0x1000,
        )]))
    }

    #[test]
    fn a_map_lives_while_one_of_its_requests_does() {
        let mut pins = MapPins::default();
        let old = map();
        let a = pins.pin(&old);
        let b = pins.pin(&old);
        assert_eq!(Arc::strong_count(&old), 2, "one reference for both");
        let new = map();
        let c = pins.pin(&new);
        assert_eq!(pins.held(), 2);
        pins.unpin(a);
        assert_eq!(Arc::strong_count(&old), 2, "b still points into it");
        pins.unpin(b);
        assert_eq!(Arc::strong_count(&old), 1, "let go with its last request");
        pins.unpin(c);
        assert_eq!(
            Arc::strong_count(&new),
            2,
            "the latest map stays for the next request"
        );
        let d = pins.pin(&new);
        assert_eq!(Arc::strong_count(&new), 2, "and takes no new reference");
        pins.unpin(d);
        pins.release_idle();
        assert_eq!(Arc::strong_count(&new), 1, "released on a map change");
        assert_eq!(pins.held(), 0);
    }

    #[test]
    fn the_former_latest_map_goes_once_idle_when_another_is_pinned() {
        let mut pins = MapPins::default();
        let (one, two) = (map(), map());
        let a = pins.pin(&one);
        pins.unpin(a);
        assert_eq!(Arc::strong_count(&one), 2);
        let b = pins.pin(&two);
        assert_eq!(Arc::strong_count(&one), 1, "idle and no longer the latest");
        let c = pins.pin(&one);
        assert_eq!(pins.held(), 2, "back to the first map, the second busy");
        pins.unpin(b);
        assert_eq!(Arc::strong_count(&two), 1, "the second went with b");
        pins.unpin(c);
        assert_eq!(pins.held(), 1);
    }

    #[test]
    fn a_pin_of_another_set_changes_nothing() {
        let mut pins = MapPins::default();
        let m = map();
        let a = pins.pin(&m);
        let _b = pins.pin(&m);
        let other_map = map();
        let other = MapPins::default().pin(&other_map);
        pins.unpin(other);
        pins.unpin(a);
        assert_eq!(pins.held(), 1);
        assert_eq!(Arc::strong_count(&m), 2);
    }
}
