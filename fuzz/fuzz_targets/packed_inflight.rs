//! The in-flight record of a packed ring a restarted daemon reads back:
//! arbitrary bytes in the area a frontend hands over, then lists taken,
//! completed and published, then a second recovery (see
//! `sqcq_target::fuzzing::packed_inflight_record`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sqcq_target::fuzzing::packed_inflight_record(data);
});
