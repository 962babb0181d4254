//! Tests that spawn a process and tests that watch a lock go away.
//!
//! A child holds a copy of every descriptor of this process from its fork
//! to its exec (Rust opens files close-on-exec, which closes them only at
//! the exec), and with them the OFD locks of their open file
//! descriptions. `cargo test` runs a crate's tests as threads of one
//! process, so a test spawning a child could keep another test's dropped
//! image lock alive for those microseconds. Spawners take [`GUARD`] for
//! writing; tests that assert a lock is gone once its file is dropped take
//! it for reading (they may run together).

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

static GUARD: RwLock<()> = RwLock::new(());

/// Held while a test spawns a process.
pub(crate) fn spawning() -> RwLockWriteGuard<'static, ()> {
    GUARD.write().unwrap_or_else(PoisonError::into_inner)
}

/// Held while a test depends on dropped descriptors releasing their locks.
pub(crate) fn no_spawn() -> RwLockReadGuard<'static, ()> {
    GUARD.read().unwrap_or_else(PoisonError::into_inner)
}
