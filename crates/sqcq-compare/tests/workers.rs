//! `sqcq-compare` end to end with a workers axis: tiny runs of the real
//! sqcq-bench against the real sqcqd, checked for structure only (one
//! result per worker count and mode, each with I/O done by as many
//! sqcqd workers as asked for), never for timing.
//!
//! sqcq-bench is $SQCQ_BENCH_BIN, or target/{debug,release}/sqcq-bench
//! with sqcqd beside it (`cargo build -p sqcq-bench -p sqcq-target`); the
//! test is skipped, saying why, when there is none, unless
//! `SQCQ_REQUIRE_PEERS` is set (the project's test command sets it).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn bench() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SQCQ_BENCH_BIN") {
        return Some(PathBuf::from(path));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    let found = ["debug", "release"]
        .iter()
        .map(|p| root.join(p))
        .find(|dir| dir.join("sqcq-bench").is_file() && dir.join("sqcqd").is_file())
        .map(|dir| dir.join("sqcq-bench"));
    if found.is_none() {
        let why = "no sqcq-bench with sqcqd beside it in target/ (cargo build -p sqcq-bench -p sqcq-target)";
        assert!(
            std::env::var_os("SQCQ_REQUIRE_PEERS").is_none(),
            "{why}; SQCQ_REQUIRE_PEERS is set, so nothing may be skipped"
        );
        eprintln!("SKIPPED: {why}");
    }
    found
}

#[test]
fn a_workers_axis_gives_a_result_per_worker_count_and_mode() {
    let Some(bench) = bench() else { return };
    let out_dir = std::env::temp_dir().join(format!("sqcq-compare-workers-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_sqcq-compare"))
        .arg("--bench")
        .arg(&bench)
        .arg("--out")
        .arg(&out_dir)
        .args([
            "--workers",
            "1,2",
            "--device-count",
            "2",
            "--jobs",
            "2",
            "--qd",
            "4",
            "--rw",
            "randread",
            "--modes",
            "notify,sqcq-inline",
            "--runtime",
            "0.3",
            "--ramp",
            "0",
        ])
        .output()
        .expect("sqcq-compare runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.contains("Multi-worker scaling: randread QD4 NJ2 D2"),
        "{stdout}"
    );
    assert!(stdout.contains("IOPS (ratio against W1)"), "{stdout}");

    let doc: Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(doc["plan"]["workers"], serde_json::json!([1, 2]));
    assert_eq!(doc["plan"]["device_count"], 2);
    let results = doc["results"].as_array().unwrap();
    let mut cases: Vec<(u64, &str)> = results
        .iter()
        .map(|r| {
            let case = &r["case"];
            (
                case["workers"].as_u64().unwrap(),
                case["mode"].as_str().unwrap(),
            )
        })
        .collect();
    cases.sort_unstable();
    assert_eq!(
        cases,
        [
            (1, "notify"),
            (1, "sqcq-inline"),
            (2, "notify"),
            (2, "sqcq-inline")
        ]
    );
    for r in results {
        let case = &r["case"];
        assert_eq!(
            (&case["jobs"], &case["device_count"], &case["queues"]),
            (
                &serde_json::json!(2),
                &serde_json::json!(2),
                &serde_json::json!(1)
            )
        );
        let median = &r["median"];
        assert!(median["iops"].as_f64().unwrap() > 0.0, "{r}");
        // sqcqd ran as many workers as the cell asked for, and the bench
        // drove both devices.
        assert_eq!(median["workers_seen"], case["workers"], "{r}");
        assert_eq!(r["raw"]["sqcq"]["device"]["devices"], 2, "{r}");
    }
    let scaling = doc["scaling"].as_array().unwrap();
    assert_eq!(scaling.len(), 2, "a series per mode");
    for s in scaling {
        assert!(s["workers"].is_null());
        let points = s["points"].as_array().unwrap();
        assert_eq!(points.len(), 2, "{s}");
        assert_eq!(points[0]["ratio"], 1.0, "{s}");
    }
    let svg = std::fs::read_to_string(out_dir.join("workers.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("sqcq-inline"));
    let _ = std::fs::remove_dir_all(&out_dir);
}
