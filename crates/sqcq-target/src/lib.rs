//! `sqcq-target`: the device side of sqcq, a daemon (`sqcqd`) serving
//! vhost-user-scsi and vhost-user-blk devices, which QEMU's
//! `vhost-user-scsi-pci` and `vhost-user-blk-pci` (or any vhost-user
//! frontend) connect to, on null, RAM, file and Ceph RBD backstores.
//!
//! # Layers
//!
//! | module | what | knows of |
//! |---|---|---|
//! | [`runtime`] | the virtqueue runtime: the worker pool, a served queue (ring, eventfds, used-ring batching, kick / ring-poll / SQ-doorbell polling), descriptor chains, guest memory access, metrics and statistics; a device plugs in a `RequestHandler` per request queue | nothing else in the crate |
//! | [`spec`] | what a disk is made of (backstore, size, block size, identity), from the command line or a file | nothing else in the crate |
//! | [`transport`] | vhost-user for any device type ([`VirtioDevice`](crate::transport::device_type::VirtioDevice), [`DeviceSession`](crate::transport::device_type::DeviceSession)): one control thread per device socket, the session (negotiation, memory table, vrings), message handling, hostile-frontend guards | [`runtime`] |
//! | [`scsi`] | the virtio-scsi device: its device type and sessions, command requests, the control and event queues, LUN tables and hot plug | [`runtime`], [`spec`], [`transport`] |
//! | [`blk`] | the virtio-blk device: one disk, its configuration space, block requests | [`runtime`], [`spec`], [`transport`] |
//! | [`service`] | running under a service manager: readiness notifications, sockets passed in, the pidfile, user and group names | nothing else in the crate |
//! | [`config`], [`daemon`], [`registry`], [`manage`], [`rpc`], [`admin`], [`prometheus`], [`sandbox`] | the daemon: command line and file, start and stop, the devices and workers and every change to them, the management API (JSON-RPC) on the admin socket, the metrics endpoint, seccomp | everything |
//! | [`client`] | the management API's clients in the binary: `sqcqd rpc` (parameters typed by the schema, `--human` tables) and `sqcqd top` (the live view), their renderers pure functions of the answers | [`rpc`], the poll set of [`service`], the latency buckets of [`runtime`] |
//!
//! # Threads and what each owns
//!
//! - **One control thread per device** ([`device`](crate::transport::device)): owns the listening
//!   Unix socket and, while a frontend is connected, the `session::Session`
//!   (negotiated features, guest memory map, vring configuration, which
//!   worker runs which queue) and the device's state for the connection
//!   (for SCSI, [`ScsiSession`](crate::scsi::device::ScsiSession)). It
//!   handles vhost-user messages (`handler`)
//!   with `vhost`'s `BackendReqHandler`, and lets the device serve its
//!   own queues: virtio-scsi's control queue (task management,
//!   asynchronous notification) and event queue
//!   (`control`), whose traffic is rare and whose
//!   work needs the state this thread owns. A frontend that disconnects
//!   leaves the device listening for the next one (a new I_T nexus).
//! - **A pool of worker threads shared by every device** (`worker`):
//!   each owns the request queues assigned to it (`queue::ServedQueue`:
//!   the ring and its eventfds, and the device's handler: for SCSI one
//!   backstore queue per LUN and the requests in flight) and waits in one
//!   epoll set for their kicks and backstore completions. The virtqueue-to-worker map is explicit (`--queue-map`)
//!   or round robin, and logged (`device D vq Q -> worker W`); workers are
//!   created and freed, and queues moved between them, while the daemon
//!   runs ([`registry`], through the control threads). Control
//!   threads hand queues over through a channel and an eventfd (start,
//!   stop, new call fd, drain for a task management function); the request
//!   path takes no lock shared between workers.
//!
//! Guest memory is a `GuestMemoryAtomic` with a generation count
//! (`runtime::shared_memory`) that the control thread swaps on
//! SET_MEM_TABLE and dirty logging changes; a worker loads it again only
//! when the generation moved, and its in-flight requests keep the maps
//! their iovecs point into (`runtime::pins`).
//!
//! # A request
//!
//! `chain` turns a descriptor chain into checked buffer lists (loops,
//! over-long chains, buffers outside memory, wrong direction), the request
//! module parses the virtio-scsi header (`sqcq_wire::scsi`) and calls
//! `sqcq_scsi::LogicalUnit::execute`; medium commands go zero-copy to the
//! backstore (`sqcq_backstore`) with iovecs into guest memory (`guest`),
//! everything else is answered from a scratch buffer. Completions are
//! written to the used ring and published once per pass, with at most one
//! call (`used`). Bad input is answered, counted ([`metrics`](crate::runtime::metrics)) and
//! logged through a rate limiter (`ratelimit`).
//!
//! # A hostile frontend
//!
//! Whatever a frontend sends costs at most its own connection:
//! `eventfd` accepts only eventfds and never blocks on them, with
//! `stall` interrupting a write that blocks anyway; `memory` checks
//! every region against its file and `sigbus` turns memory taken away
//! later into a dropped connection; `vhost_socket` bounds the waits for a
//! whole message and for unread replies; `listen` never replaces what is
//! not a stale socket; long commands go to the backstore in slices; and
//! [`sandbox`] is the optional seccomp filter. `docs/target.md`, "Hostile
//! frontends", lists every class and its test.
//!
//! # Poll mode (VIRTIO_F_SQCQ_POLL and ring polling)
//!
//! `queue::SubmissionSource` is where a queue decides how it learns of
//! new requests: by kick, by polling the SQ doorbell of VIRTIO_F_SQCQ_POLL
//! (when negotiated), or by polling the avail ring (`--poll ring`,
//! `ring_poll`). A worker spins over its polled queues and sleeps only
//! when every one of them has asked for a notification (`poll`); it can
//! be bound to a CPU (`cpu`); every queue's figures are logged and kept
//! in a JSON file (`stats`).

#![deny(missing_docs)]

pub mod admin;
pub mod blk;
pub mod client;
pub mod config;
pub mod daemon;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod manage;
pub mod manual;
pub mod prometheus;
pub mod registry;
pub mod rpc;
pub mod runtime;
pub mod sandbox;
pub mod scsi;
pub mod service;
pub mod spec;
pub mod transport;

pub use config::{Cli, DaemonConfig, DeviceConfig, LunSpec};
pub use daemon::Daemon;
