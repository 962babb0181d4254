//! vhost-user message sequences against the daemon's real connection
//! handling: `sqcq_target::fuzzing::MessageHarness` (a `Session` behind
//! `vhost`'s `BackendReqHandler` over a socket pair, with a worker pool so
//! that queues really start), fed arbitrary messages with memfds,
//! eventfds or hung-up pipes attached, then torn down.
//!
//! Input: records `[code: u8][flags: u8][attachment: u8][len: u8][body]`
//! (see `MessageHarness::run`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sqcq_target::fuzzing::MessageHarness;

fuzz_target!(|data: &[u8]| {
    MessageHarness::new().run(data);
});
