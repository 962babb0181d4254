//! The admin socket (`--admin-socket PATH`): the management API,
//! JSON-RPC 2.0 ([`crate::rpc`]), while the daemon runs: one request (or
//! batch) per line, one response per line.
//!
//! ```text
//! {"jsonrpc":"2.0","method":"lun_add","params":{"device":0,"lun":1,"kind":"ram","size":"64M"},"id":1}
//! {"jsonrpc":"2.0","method":"stats_get","id":2}
//! {"jsonrpc":"2.0","method":"fault_break","params":{"device":0,"vq":2},"id":3}
//! ```
//!
//! A line that is not JSON is answered with JSON-RPC's parse error
//! (-32700). The socket is created with mode 0600 unless
//! `--admin-socket-mode` says otherwise: whoever can use it can make the
//! daemon open any file it can open. One thread serves it
//! (`admin/server.rs`): up to [`MAX_CONNECTIONS`] clients at once, of
//! which idle ones delay nobody, and one request at a time, so changes
//! are serialised; a request waits until its change reached every worker
//! (and, for a removal, until the LUN's requests in flight completed)
//! before it replies.
//!
//! The `fault_break` method is fault injection, for testing how a driver
//! recovers: the request queue `vq` (every running request queue of the
//! device without `vq`) breaks when it next finds a request, exactly as
//! when the driver writes a doorbell value no correct driver writes (spec
//! 6.1) or corrupts its ring: it stops without taking that request, its
//! error eventfd is signalled (QEMU then sets DEVICE_NEEDS_RESET, with the
//! project's patch), and it is served again only after the driver resets
//! the device.
//!
//! `sqcqd rpc --admin-socket PATH METHOD [key=value]...`
//! ([`crate::rpc::call`]) is the client.

mod server;

pub use server::{AdminServer, IDLE_TIMEOUT, MAX_CONNECTIONS, MAX_LINE};
