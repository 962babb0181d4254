//! The atomics and fences the handshake uses.
//!
//! `handshake.rs` and `doorbell.rs` reach them only through this module, so
//! that `tests/loom.rs` can compile those very files against loom's
//! atomics (it includes them with `#[path]` next to a `sync` module of its
//! own) and model-check the real code.

pub(crate) use core::sync::atomic::{AtomicU16, Ordering, fence};
