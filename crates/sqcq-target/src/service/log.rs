//! The daemon's log: `--log-level` and `--log-format`, on stderr.
//!
//! Three forms, all built on `tracing-subscriber`'s formatter:
//! - `text`: a time stamp, the level, the module, the message and its
//!   fields (colours on a terminal only);
//! - `json`: one JSON object per line (`timestamp`, `level`, `target`,
//!   the message and the fields flattened), for log shippers;
//! - `journal`: no time stamp (the journal has its own) and the syslog
//!   priority as a `<N>` prefix, which journald turns into the entry's
//!   PRIORITY (sd-daemon(3)): `journalctl -p warning` then shows the
//!   daemon's warnings and errors alone.
//!
//! Without `--log-format` the daemon writes `journal` when its stderr is
//! the journal (systemd sets `JOURNAL_STREAM` to the stream's
//! `device:inode`, which is compared with stderr's, as systemd.exec(5)
//! says to), and `text` otherwise.

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Time stamp, level, module, message and fields.
    Text,
    /// One JSON object per line.
    Json,
    /// `<priority>module: message fields`, for journald.
    Journal,
}

/// A `--log-level` value: a level (`error`, `warn`, `info`, `debug`,
/// `trace`) or an `EnvFilter` directive list
/// (`info,sqcq_target::admin=debug`).
/// Each directive must be a level or `target=level`: a lone word that is
/// no level (`loud`) would be read by `EnvFilter` as a target to trace,
/// silencing everything else.
pub fn parse_level(s: &str) -> Result<String, String> {
    let bad = |why: String| {
        format!(
            "invalid log level {s:?}: {why} (error, warn, info, debug, trace, off, or a \
             filter such as info,sqcq_target::admin=debug)"
        )
    };
    for d in s.split(',') {
        let level = d.rsplit_once('=').map_or(d, |(_, l)| l);
        if level.trim().is_empty()
            || level
                .trim()
                .parse::<tracing::level_filters::LevelFilter>()
                .is_err()
        {
            return Err(bad(format!("{d:?} names no level")));
        }
    }
    EnvFilter::try_new(s)
        .map(|_| s.to_owned())
        .map_err(|e| bad(e.to_string()))
}

/// The syslog priority of a level (sd-daemon(3): `SD_ERR` .. `SD_DEBUG`).
pub fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// Whether stderr is the journal stream systemd connected
/// (`JOURNAL_STREAM=device:inode` naming stderr itself: a child whose
/// stderr was redirected inherits the variable but not the stream).
pub fn stderr_is_journal() -> bool {
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    let Ok(meta) = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .and_then(|fd| std::fs::File::from(fd).metadata())
    else {
        return false;
    };
    dev.parse::<u64>().ok() == Some(meta.dev()) && ino.parse::<u64>().ok() == Some(meta.ino())
}

/// The journal's line: `<priority>target: message fields`.
struct Journal;

impl<S, N> FormatEvent<S, N> for Journal
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        write!(writer, "<{}>{}: ", priority(*meta.level()), meta.target())?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Installs the daemon's logger on stderr: `level` (else `RUST_LOG`, else
/// `info`) in `format` (else [`stderr_is_journal`] decides). Starts no
/// thread.
pub fn init(level: Option<&str>, format: Option<LogFormat>) {
    let filter = match level {
        Some(l) => EnvFilter::new(l),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let format = format.unwrap_or(if stderr_is_journal() {
        LogFormat::Journal
    } else {
        LogFormat::Text
    });
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    // `try_init`: a second call (tests) keeps the first logger.
    let _ = match format {
        LogFormat::Text => builder
            // No colour codes in a journal or a log file.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        LogFormat::Journal => builder.with_ansi(false).event_format(Journal).try_init(),
    };
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    #[test]
    fn journal_lines_carry_the_syslog_priority() {
        let buf = Buffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(buf.clone())
            .with_ansi(false)
            .event_format(Journal)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(device = 3, "broken");
            tracing::warn!("slow");
            tracing::info!(lun = 1, "ready");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let target = module_path!();
        assert_eq!(
            text,
            format!("<3>{target}: broken device=3\n<4>{target}: slow\n<6>{target}: ready lun=1\n")
        );
    }

    #[test]
    fn levels_and_filters_are_checked() {
        for ok in ["warn", "info,sqcq_target::admin=debug", "trace"] {
            assert_eq!(parse_level(ok).as_deref(), Ok(ok));
        }
        for bad in ["loud", "", "info,", "sqcq_target=loud", "info,sqcq_target"] {
            assert!(parse_level(bad).is_err(), "{bad:?}");
        }
    }
}
