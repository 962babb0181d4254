//! The capacity of a backstore, shared by the backstore and every queue
//! opened on it, so that [`crate::Backstore::resize`] takes effect on the
//! queues already open.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Capacity in bytes, written by `resize` (the control plane) and read by
/// every queue on each range check.
#[derive(Clone, Debug)]
pub(crate) struct Capacity(Arc<AtomicU64>);

impl Capacity {
    pub(crate) fn new(bytes: u64) -> Self {
        Capacity(Arc::new(AtomicU64::new(bytes)))
    }

    /// The current capacity in bytes.
    pub(crate) fn get(&self) -> u64 {
        // Acquire pairs with the Release in `set`: a queue that sees the
        // new capacity also sees the backing storage grown before it
        // (file extended, RAM pages made writable).
        self.0.load(Ordering::Acquire)
    }

    /// Publishes a new capacity; storage for it must already exist.
    pub(crate) fn set(&self, bytes: u64) {
        self.0.store(bytes, Ordering::Release);
    }
}
