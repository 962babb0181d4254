//! Guest memory as the control thread replaces it and the workers read
//! it: vm-memory's `GuestMemoryAtomic` and a generation count.
//!
//! The control thread swaps the map on a memory table change and when
//! dirty logging starts or stops ([`SharedMemory::replace`]). A worker
//! needs the current map for every pass over a queue, but loading a
//! `GuestMemoryAtomic` is an `arc-swap` load (a sequentially consistent
//! store into a debt slot) and keeping the map past the pass is an `Arc`
//! clone: three or four locked instructions, full barriers on x86, for
//! every pass, which at depth 1 is every request. A [`MemoryView`] keeps
//! the map it loaded and looks at the generation (one plain load) before
//! each pass; it loads the map again only when the generation moved.
//!
//! A pass that began before a replacement finishes on the map it
//! started with, as it did with a load per pass; the next pass sees the
//! new one. The view keeps the map as a [`Mapped`], with the table of its
//! regions the pass's accesses go through, built once per map. No library
//! offers the generation: `GuestMemoryAtomic` has none, and it is the
//! only thing added.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryLoadGuard};

use crate::runtime::batch::Mapped;
use crate::runtime::guest::GuestMem;

/// The guest memory of one connection, shared by its control thread and
/// the workers serving its queues.
#[derive(Clone, Debug)]
pub struct SharedMemory {
    map: GuestMemoryAtomic<GuestMem>,
    /// Bumped after every replacement.
    generation: Arc<AtomicU64>,
}

/// The map could not be replaced: a thread panicked while replacing it.
#[derive(Debug, thiserror::Error)]
#[error("guest memory lock poisoned")]
pub struct Poisoned;

impl SharedMemory {
    /// Memory that starts as `map`.
    pub fn new(map: GuestMem) -> Self {
        SharedMemory {
            map: GuestMemoryAtomic::new(map),
            generation: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The current map (a full load: for the control thread, and for
    /// work that is not per request).
    pub fn memory(&self) -> GuestMemoryLoadGuard<GuestMem> {
        self.map.memory()
    }

    /// Makes `map` the current map; every worker uses it from its next
    /// pass.
    pub fn replace(&self, map: GuestMem) -> Result<(), Poisoned> {
        self.map.lock().map_err(|_| Poisoned)?.replace(map);
        // Release: pairs with the Acquire load in `MemoryView::take`; a
        // view that sees the new generation loads a map at least as new
        // as this one.
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// A worker's view of the memory.
    pub fn view(&self) -> MemoryView {
        MemoryView {
            shared: self.clone(),
            cached: None,
            seen: self.generation.load(Ordering::Acquire),
            changed: false,
        }
    }
}

/// A worker's copy of the current map, loaded again only when the
/// generation moved.
#[derive(Debug)]
pub struct MemoryView {
    shared: SharedMemory,
    /// The map of generation `seen`; `None` while a pass holds it.
    cached: Option<Mapped>,
    seen: u64,
    /// A newer map was loaded since [`MemoryView::take_changed`] last
    /// said so.
    changed: bool,
}

impl MemoryView {
    /// The current map, for one pass: given back with [`Self::restore`]
    /// (a pass that does not give it back only costs the next one a
    /// load).
    #[inline]
    pub fn take(&mut self) -> Mapped {
        // Acquire: pairs with the Release increment in `replace`.
        let now = self.shared.generation.load(Ordering::Acquire);
        match self.cached.take() {
            Some(m) if now == self.seen => m,
            _ => {
                // The generation is read before the map: the map loaded
                // is at least that generation's (a newer one only means
                // one more load later).
                self.changed |= now != self.seen;
                self.seen = now;
                Mapped::new(self.shared.memory().into_inner())
            }
        }
    }

    /// Gives back the map [`Self::take`] returned.
    #[inline]
    pub fn restore(&mut self, map: Mapped) {
        self.cached = Some(map);
    }

    /// Whether a newer map was taken since the last call.
    pub fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    /// The current map without keeping it (a full load).
    pub fn load(&self) -> GuestMemoryLoadGuard<GuestMem> {
        self.shared.memory()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestAddress;

    fn map() -> GuestMem {
        crate::runtime::guest::test_memory(&[(GuestAddress(0), 0x1000)])
    }

    #[test]
    fn a_view_follows_every_replacement_and_reuses_its_map_otherwise() {
        let shared = SharedMemory::new(map());
        let mut view = shared.view();
        let first = view.take();
        let first_map = Arc::clone(first.map());
        view.restore(first);
        let again = view.take();
        assert!(
            Arc::ptr_eq(&first_map, again.map()),
            "no replacement, same map"
        );
        assert!(!view.take_changed());
        view.restore(again);
        shared.replace(map()).unwrap();
        let after = view.take();
        assert!(
            !Arc::ptr_eq(&first_map, after.map()),
            "the replacement is seen"
        );
        assert!(Arc::ptr_eq(after.map(), &shared.memory().into_inner()));
        assert!(view.take_changed(), "and told once");
        assert!(!view.take_changed());
        view.restore(after);
    }

    #[test]
    fn a_pass_that_keeps_its_map_costs_the_next_a_load_only() {
        let shared = SharedMemory::new(map());
        let mut view = shared.view();
        let kept = view.take();
        let next = view.take();
        assert!(
            Arc::ptr_eq(kept.map(), next.map()),
            "loaded again, the same map"
        );
        assert!(!view.take_changed(), "not a change");
    }

    #[test]
    fn a_view_made_after_a_replacement_starts_from_the_current_map() {
        let shared = SharedMemory::new(map());
        shared.replace(map()).unwrap();
        let mut view = shared.view();
        let m = view.take();
        assert!(Arc::ptr_eq(m.map(), &shared.memory().into_inner()));
    }
}
