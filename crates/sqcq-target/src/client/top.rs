//! `sqcqd top`: a live view of a running daemon, like `spdk_top`. Every
//! interval it takes a [`Sample`] (one JSON-RPC batch on the admin
//! socket) and shows what happened since the last one
//! (`rates::frame`).
//!
//! On a terminal the frame is redrawn in place on the alternate screen
//! with plain ANSI escapes, cut to the terminal's size; `q` or Ctrl-C
//! quits and gives the screen back as it was. Otherwise (`--batch`, or
//! stdout not a terminal) frames are appended, one after the other,
//! separated by a blank line. SIGINT, SIGTERM and SIGHUP are taken
//! through a signalfd, so every way out goes through the same path that
//! restores the terminal; keys are read one by one (no echo, no line
//! buffering) only while the screen is redrawn, with ISIG kept so that
//! Ctrl-C stays a signal.

use std::io::{self, IsTerminal, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use thiserror::Error;

use super::rates::frame;
use super::sample::{FetchError, Sample};
use crate::service::pollset::PollSet;

/// How long a sample may take before the daemon counts as gone.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The shortest interval.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// `sqcqd top`: the command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "sqcqd top",
    about = "A live view of a running sqcqd: IOPS, throughput, service time, notifications per \
             I/O and polling of every device and queue, CPU of every worker",
    after_help = "Rates are over the last interval. AVG-us and P99-us are the service time inside \
                  the daemon (from the pass that took a request to the pass that completed it: 0 \
                  for null and ram LUNs); NOTIF/IO is (kicks + calls) / requests; SPIN/s and \
                  SLEEP/s are those of polled queues, brought up to date when the poller sleeps \
                  and at every --stats-interval of the daemon. q or Ctrl-C quits."
)]
pub struct TopCli {
    /// The daemon's admin socket [default: $SQCQ_ADMIN_SOCKET, else
    /// /run/sqcq/sqcqd.sock for root, else $XDG_RUNTIME_DIR/sqcq/sqcqd.sock].
    #[arg(long, value_name = "PATH")]
    pub admin_socket: Option<PathBuf>,
    /// Seconds between two frames (at least 0.1).
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = parse_interval)]
    pub interval: Duration,
    /// Frames to show before exiting [default: until q or Ctrl-C].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub iterations: Option<u64>,
    /// Append plain frames instead of redrawing the screen (the default
    /// when stdout is not a terminal).
    #[arg(long)]
    pub batch: bool,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| *d >= MIN_INTERVAL)
        .ok_or_else(|| format!("{s}: at least {} s", MIN_INTERVAL.as_secs_f64()))
}

/// Why `sqcqd top` ended other than by being asked to.
#[derive(Debug, Error)]
pub enum TopError {
    /// No sample could be taken: the daemon is not there, went away or
    /// refused a call.
    #[error("{}: {}", socket.display(), crate::runtime::error_chain(source))]
    Fetch {
        /// The admin socket.
        socket: PathBuf,
        /// What failed.
        source: FetchError,
    },
    /// The terminal or stdout failed.
    #[error("the terminal: {0}")]
    Terminal(#[source] io::Error),
}

impl TopError {
    /// The exit status: 2 when the daemon could not be asked (as for
    /// `sqcqd rpc`), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            TopError::Fetch {
                source: FetchError::Unreachable(_),
                ..
            } => 2,
            _ => 1,
        }
    }
}

/// Runs the view until `q`, a signal, `--iterations` frames, or an
/// error.
pub fn run(cli: &TopCli) -> Result<(), TopError> {
    let socket = super::admin_socket(cli.admin_socket.clone());
    let fetch = || {
        let sample =
            Sample::fetch(&socket, None, FETCH_TIMEOUT).map_err(|source| TopError::Fetch {
                socket: socket.clone(),
                source,
            });
        (sample, Instant::now())
    };
    let signals = Signals::block().map_err(TopError::Terminal)?;
    let (first, mut then) = fetch();
    let mut before = first?;
    let full = !cli.batch && io::stdout().is_terminal();
    let mut screen = Screen::new(full).map_err(TopError::Terminal)?;
    screen
        .placeholder(&format!(
            "sqcqd top: {}: the first figures in {:.1} s",
            socket.display(),
            cli.interval.as_secs_f64()
        ))
        .map_err(TopError::Terminal)?;
    let mut shown = 0;
    while cli.iterations.is_none_or(|n| shown < n) {
        let deadline = then + cli.interval;
        loop {
            match screen.wait(&signals, deadline) {
                Ok(Woken::Deadline) => break,
                Ok(Woken::Quit) => return Ok(()),
                Ok(Woken::Resized) => screen.redraw(),
                Ok(Woken::Nothing) => Ok(()),
                Err(e) => Err(e),
            }
            .map_err(TopError::Terminal)?;
        }
        let (sample, now) = fetch();
        let after = sample?;
        let lines = frame(&before, &after, now.duration_since(then));
        match screen.draw(&lines) {
            // `sqcqd top --batch | head`: whoever reads is done.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
            r => r.map_err(TopError::Terminal)?,
        }
        (before, then) = (after, now);
        shown += 1;
    }
    Ok(())
}

/// What ended a wait.
enum Woken {
    /// The interval is over: take a sample.
    Deadline,
    /// `q`, a signal, or the terminal gone.
    Quit,
    /// The terminal changed size: draw again.
    Resized,
    /// Something else (a key that is not `q`, a signal handled
    /// elsewhere): wait on.
    Nothing,
}

/// SIGINT, SIGTERM, SIGHUP and SIGWINCH, blocked and read from a
/// signalfd.
struct Signals(OwnedFd);

impl Signals {
    /// Blocks the signals (this is the only thread) and opens the
    /// signalfd that receives them.
    fn block() -> io::Result<Self> {
        // SAFETY: an all-zero sigset_t is valid for sigemptyset, which
        // initialises it.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid sigset_t owned by this frame.
        unsafe { libc::sigemptyset(&mut set) };
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGWINCH] {
            // SAFETY: `set` was initialised by sigemptyset.
            unsafe { libc::sigaddset(&mut set, sig) };
        }
        // SAFETY: `set` is initialised; a null old-set pointer is allowed.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        // SAFETY: -1 asks for a new descriptor; `set` is initialised.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and nothing else owns it.
        Ok(Signals(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The signal pending, if any.
    fn take(&self) -> io::Result<Option<u32>> {
        // SAFETY: all-zero is a valid signalfd_siginfo (plain data).
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: `info` is `size` writable bytes; the descriptor is ours.
        let n = unsafe { libc::read(self.0.as_raw_fd(), (&raw mut info).cast(), size) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(info.ssi_signo))
    }
}

/// Where frames go.
struct Screen {
    /// Redrawn in place (`None`: appended).
    full: Option<FullScreen>,
    /// The last frame drawn, for a redraw.
    last: Vec<String>,
    /// Frames appended so far.
    appended: u64,
}

/// A terminal taken over: the alternate screen, the cursor hidden, and
/// stdin's mode (when it is a terminal) to restore.
struct FullScreen {
    saved: Option<libc::termios>,
}

impl FullScreen {
    fn enter() -> io::Result<Self> {
        let saved = if io::stdin().is_terminal() {
            Some(keys_one_by_one()?)
        } else {
            None
        };
        // The alternate screen, the cursor hidden.
        let mut out = io::stdout().lock();
        out.write_all(b"\x1b[?1049h\x1b[?25l")?;
        out.flush()?;
        Ok(FullScreen { saved })
    }
}

impl Drop for FullScreen {
    fn drop(&mut self) {
        let mut out = io::stdout().lock();
        let _ = out.write_all(b"\x1b[?25h\x1b[?1049l");
        let _ = out.flush();
        if let Some(saved) = &self.saved {
            // SAFETY: `saved` is the mode tcgetattr read from stdin.
            unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, saved) };
        }
    }
}

/// Turns off stdin's line buffering and echo (keeping ISIG: Ctrl-C is a
/// signal still); returns the mode it had.
fn keys_one_by_one() -> io::Result<libc::termios> {
    // SAFETY: all-zero is a valid termios for tcgetattr to fill.
    let mut mode: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: stdin is a terminal; `mode` is writable.
    if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut mode) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let saved = mode;
    mode.c_lflag &= !(libc::ICANON | libc::ECHO);
    mode.c_cc[libc::VMIN] = 1;
    mode.c_cc[libc::VTIME] = 0;
    // SAFETY: `mode` is a valid termios.
    if unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &mode) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(saved)
}

/// The terminal's rows and columns, if stdout is one.
fn terminal_size() -> Option<(usize, usize)> {
    // SAFETY: all-zero is a valid winsize for the ioctl to fill.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes a winsize to the pointer given.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_row > 0 && ws.ws_col > 0)
        .then(|| (usize::from(ws.ws_row), usize::from(ws.ws_col)))
}

impl Screen {
    fn new(full: bool) -> io::Result<Self> {
        Ok(Screen {
            full: full.then(FullScreen::enter).transpose()?,
            last: Vec::new(),
            appended: 0,
        })
    }

    /// Shows `line` alone on a full screen until the first frame (frames
    /// appended begin with the first frame).
    fn placeholder(&mut self, line: &str) -> io::Result<()> {
        if self.full.is_none() {
            return Ok(());
        }
        self.draw(&[line.to_owned()])
    }

    /// Shows `lines`: the whole screen redrawn, or appended.
    fn draw(&mut self, lines: &[String]) -> io::Result<()> {
        self.last = lines.to_vec();
        let mut out = io::stdout().lock();
        if self.full.is_none() {
            if self.appended > 0 {
                writeln!(out)?;
            }
            self.appended += 1;
            for l in lines {
                writeln!(out, "{l}")?;
            }
            return out.flush();
        }
        let (rows, cols) = terminal_size().unwrap_or((24, 80));
        // From the top left; each line cleared to its end; no newline
        // after the last row, which would scroll.
        let mut text = String::from("\x1b[H");
        for (i, l) in lines.iter().take(rows).enumerate() {
            if i > 0 {
                text.push_str("\r\n");
            }
            text.push_str(super::units::clip(l, cols));
            text.push_str("\x1b[K");
        }
        text.push_str("\x1b[J");
        out.write_all(text.as_bytes())?;
        out.flush()
    }

    /// Draws the last frame again (the terminal changed size).
    fn redraw(&mut self) -> io::Result<()> {
        if self.full.is_none() {
            return Ok(());
        }
        let last = std::mem::take(&mut self.last);
        self.draw(&last)
    }

    /// Waits for `deadline`, a signal or (on a full screen with a
    /// terminal on stdin) a key.
    fn wait(&mut self, signals: &Signals, deadline: Instant) -> io::Result<Woken> {
        let keys = self.full.as_ref().is_some_and(|f| f.saved.is_some());
        let mut fds = PollSet::with_capacity(2);
        fds.push(signals.0.as_raw_fd(), libc::POLLIN);
        if keys {
            fds.push(libc::STDIN_FILENO, libc::POLLIN);
        }
        if !fds.wait(Some(deadline))? {
            return Ok(Woken::Nothing);
        }
        if fds.revents(0) != 0 {
            return Ok(match signals.take()? {
                Some(s) if s == libc::SIGWINCH.unsigned_abs() => Woken::Resized,
                Some(_) => Woken::Quit,
                None => Woken::Nothing,
            });
        }
        if keys && fds.revents(1) != 0 {
            let mut key = [0u8; 16];
            let n = io::stdin().lock().read(&mut key)?;
            // End of input (the terminal hung up) quits too.
            if n == 0 || key[..n].iter().any(|k| matches!(k, b'q' | b'Q')) {
                return Ok(Woken::Quit);
            }
            return Ok(Woken::Nothing);
        }
        if Instant::now() >= deadline {
            return Ok(Woken::Deadline);
        }
        Ok(Woken::Nothing)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn the_command_line() {
        let cli = TopCli::parse_from(["sqcqd top"]);
        assert_eq!(cli.interval, Duration::from_secs(1));
        assert_eq!((cli.iterations, cli.batch), (None, false));
        let cli = TopCli::parse_from([
            "sqcqd top",
            "--interval",
            "0.2",
            "--iterations",
            "2",
            "--batch",
        ]);
        assert_eq!(cli.interval, Duration::from_millis(200));
        assert_eq!((cli.iterations, cli.batch), (Some(2), true));
        for bad in [
            &["--interval", "0.01"][..],
            &["--interval", "x"],
            &["--interval", "-1"],
            &["--iterations", "0"],
        ] {
            let args = std::iter::once("sqcqd top").chain(bad.iter().copied());
            assert!(TopCli::try_parse_from(args).is_err(), "{bad:?}");
        }
    }
}
