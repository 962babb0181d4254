//! The stage clock: where a worker's time goes between seeing new
//! requests on a polled ring and publishing their completions, measured
//! in place, in nanoseconds per request.
//!
//! On a VM without hardware performance counters, where `perf` moves the
//! threads it samples, callgrind counts a request's instructions
//! (`scripts/request-cost.sh`) but cannot say what the cache misses of a
//! real driver on another CPU add to them. The clock reads the pass
//! clock's counter (the TSC where the kernel trusts it) at the end of each
//! stage of a pass and adds the time since the previous read to that
//! stage: the avail index and entries, each chain walked and checked, the
//! request header read, the command run by its logical unit, the request
//! handled, the pass's bookkeeping, the backstore commit, the reap (the
//! responses and used entries written) and the publication of the used
//! index. Every `REPORT_PASSES` (2^18) passes a worker logs the figures
//! (`tracing` at INFO, target `sqcq_target::runtime::stage_clock`) and
//! starts again.
//!
//! Only polled rings' passes are timed (`ServedQueue::drain_ring`), from
//! the poll that found new requests to the publication. Each read of the
//! clock costs its own time, which lands in the stage it ends: the report
//! says how much one read takes on the machine, to be taken off each
//! stage.
//!
//! Built only with the `stage-clock` feature (docs/benchmarks.md, "The
//! target's time per request, in place"): without it [`mark`] is an
//! empty inline function and the request path is the same as ever.

/// A point of a pass at which the clock is read; the time since the
/// previous point goes to the stage that ends here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// A pass begins: a poll found new requests.
    Pass,
    /// The avail index read again and checked, the gathering done, the
    /// ring's entries located.
    Available,
    /// The heads of the entries read.
    Heads,
    /// A chain walked and checked, the request accepted.
    Chain,
    /// The request header read (and, with SCSI, its logical unit found).
    Header,
    /// SCSI: the command parsed and run by its logical unit.
    Executed,
    /// The request handled: its backstore operation queued, or the
    /// response of a command answered at once written.
    Handled,
    /// Every chain of the pass handled: what the loop does around them.
    Taken,
    /// The backstore operations sent.
    Committed,
    /// Completions reaped: responses and used entries written.
    Reaped,
    /// The used index published (and the driver notified if it asked):
    /// the pass ends.
    Published,
}

/// Stages that end at a mark (all but [`Stage::Pass`]), in pass order.
#[cfg(any(test, feature = "stage-clock"))]
const TIMED: [Stage; 10] = [
    Stage::Available,
    Stage::Heads,
    Stage::Chain,
    Stage::Header,
    Stage::Executed,
    Stage::Handled,
    Stage::Taken,
    Stage::Committed,
    Stage::Reaped,
    Stage::Published,
];

#[cfg(any(test, feature = "stage-clock"))]
impl Stage {
    /// Its name in the report.
    fn name(self) -> &'static str {
        match self {
            Stage::Pass => "pass",
            Stage::Available => "available",
            Stage::Heads => "heads",
            Stage::Chain => "chain",
            Stage::Header => "header",
            Stage::Executed => "executed",
            Stage::Handled => "handled",
            Stage::Taken => "taken",
            Stage::Committed => "committed",
            Stage::Reaped => "reaped",
            Stage::Published => "published",
        }
    }
}

/// Passes between two reports of a worker.
#[cfg(any(test, feature = "stage-clock"))]
const REPORT_PASSES: u64 = 1 << 18;

/// The time of one thread's passes by stage, the clock given at each
/// mark.
#[cfg(any(test, feature = "stage-clock"))]
#[derive(Debug, Default)]
pub(crate) struct StageTimes {
    /// When the previous mark of the current pass was; `None` outside a
    /// pass (marks there are not counted).
    last: Option<u64>,
    /// Nanoseconds by stage, indexed like [`TIMED`].
    ns: [u64; TIMED.len()],
    passes: u64,
    requests: u64,
}

#[cfg(any(test, feature = "stage-clock"))]
impl StageTimes {
    /// `stage` ended at `now`. Returns the report, and starts again, when
    /// a pass ends that completes [`REPORT_PASSES`].
    pub(crate) fn mark(&mut self, stage: Stage, now: u64) -> Option<String> {
        if stage == Stage::Pass {
            self.passes += 1;
            self.last = Some(now);
            return None;
        }
        let last = self.last?;
        // `TIMED` is the stages in declaration order after `Pass`.
        if let Some(ns) = (stage as usize)
            .checked_sub(1)
            .and_then(|i| self.ns.get_mut(i))
        {
            *ns += now.saturating_sub(last);
        }
        if stage == Stage::Chain {
            self.requests += 1;
        }
        if stage != Stage::Published {
            self.last = Some(now);
            return None;
        }
        self.last = None;
        if self.passes < REPORT_PASSES {
            return None;
        }
        let report = self.report();
        *self = StageTimes::default();
        Some(report)
    }

    /// Nanoseconds per request by stage, and in all.
    fn report(&self) -> String {
        let per = |ns: u64| ns as f64 / self.requests.max(1) as f64;
        let mut out = format!(
            "{} passes, {} requests, ns per request:",
            self.passes, self.requests
        );
        for (stage, ns) in TIMED.iter().zip(self.ns) {
            out.push_str(&format!(" {} {:.1}", stage.name(), per(ns)));
        }
        out.push_str(&format!(" total {:.1}", per(self.ns.iter().sum())));
        out
    }
}

#[cfg(feature = "stage-clock")]
thread_local! {
    static TIMES: std::cell::RefCell<StageTimes> = std::cell::RefCell::new(StageTimes::default());
}

/// `stage` ended now (see the module documentation); nothing without
/// the `stage-clock` feature.
#[inline(always)]
pub(crate) fn mark(stage: Stage) {
    #[cfg(feature = "stage-clock")]
    {
        let now = crate::runtime::pass::now_ns();
        if let Some(report) = TIMES.with_borrow_mut(|t| t.mark(stage, now)) {
            tracing::info!(
                worker = crate::runtime::pass::worker(),
                clock_read_ns = clock_read_ns(),
                "stage clock: {report}"
            );
        }
    }
    #[cfg(not(feature = "stage-clock"))]
    let _ = stage;
}

/// What one read of the clock costs here (ns, mean of a burst of reads).
#[cfg(feature = "stage-clock")]
fn clock_read_ns() -> f64 {
    const READS: u32 = 1000;
    let start = crate::runtime::pass::now_ns();
    let mut end = start;
    for _ in 0..READS {
        end = std::hint::black_box(crate::runtime::pass::now_ns());
    }
    end.saturating_sub(start) as f64 / f64::from(READS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stage_gets_the_time_since_the_previous_mark() {
        let mut t = StageTimes::default();
        // A pass of two requests, the second's header stage 40 ns.
        let marks = [
            (Stage::Pass, 1000),
            (Stage::Available, 1020),
            (Stage::Heads, 1025),
            (Stage::Chain, 1090),
            (Stage::Header, 1100),
            (Stage::Handled, 1130),
            (Stage::Chain, 1150),
            (Stage::Header, 1190),
            (Stage::Handled, 1200),
            (Stage::Taken, 1210),
            (Stage::Committed, 1220),
            (Stage::Reaped, 1260),
            (Stage::Published, 1280),
        ];
        for (stage, now) in marks {
            assert_eq!(t.mark(stage, now), None);
        }
        assert_eq!((t.passes, t.requests), (1, 2));
        for (i, stage) in TIMED.iter().enumerate() {
            assert_eq!(*stage as usize, i + 1, "TIMED follows the declaration");
        }
        let at = |s: Stage| t.ns[TIMED.iter().position(|x| *x == s).unwrap()];
        assert_eq!(at(Stage::Chain), 65 + 20);
        assert_eq!(at(Stage::Header), 10 + 40);
        assert_eq!(at(Stage::Executed), 0, "not marked: nothing");
        assert_eq!(t.ns.iter().sum::<u64>(), 280, "the whole pass, once");
        // Outside a pass (a reap the poll made with nothing new) marks
        // count nothing, and the next pass starts afresh.
        t.mark(Stage::Reaped, 5000);
        t.mark(Stage::Published, 5010);
        assert_eq!(t.ns.iter().sum::<u64>(), 280);
        assert!(t.report().contains("header 25.0"), "{}", t.report());
    }

    #[test]
    fn a_report_comes_after_its_passes_and_starts_again() {
        let mut t = StageTimes::default();
        let mut reports = Vec::new();
        for i in 0..REPORT_PASSES + 3 {
            t.mark(Stage::Pass, 10 * i);
            t.mark(Stage::Chain, 10 * i + 4);
            if let Some(r) = t.mark(Stage::Published, 10 * i + 6) {
                reports.push(r);
            }
        }
        assert_eq!(reports.len(), 1);
        assert!(
            reports[0].starts_with(&format!("{REPORT_PASSES} passes, {REPORT_PASSES} requests")),
            "{}",
            reports[0]
        );
        assert!(reports[0].contains("chain 4.0") && reports[0].contains("total 6.0"));
        assert_eq!(t.passes, 3, "counted again from zero");
    }
}
