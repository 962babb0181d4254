//! The in-flight record a restarted daemon reads back: arbitrary bytes in
//! the area a frontend hands over, then takes, completions and publishes,
//! then a second recovery (see `sqcq_target::fuzzing::inflight_record`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sqcq_target::fuzzing::inflight_record(data);
});
