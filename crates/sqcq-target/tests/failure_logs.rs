//! A failing test leaves its logs: the temporary directory of a test that
//! panics stays, with the daemon's log in it (and printed into the test's
//! output); a passing test's goes.

mod common;

use std::sync::mpsc;

use common::TempDir;

#[test]
fn a_failed_test_keeps_its_directory_and_a_passing_one_does_not() {
    let (tx, rx) = mpsc::channel();
    let failed = std::thread::spawn(move || {
        let dir = TempDir::new("failure-logs-failed");
        std::fs::write(dir.path("sqcqd.log"), "the daemon's last words\n").unwrap();
        tx.send(dir.0.clone()).unwrap();
        panic!("a test fails");
    })
    .join();
    assert!(failed.is_err());
    let kept = rx.recv().unwrap();
    let log = std::fs::read_to_string(kept.join("sqcqd.log"));
    std::fs::remove_dir_all(&kept).unwrap();
    assert_eq!(log.unwrap(), "the daemon's last words\n");

    let passed = TempDir::new("failure-logs-passed");
    let path = passed.0.clone();
    drop(passed);
    assert!(!path.exists());
}
