//! `sqcqd`: the sqcq daemon serving vhost-user-scsi and vhost-user-blk
//! devices.

use std::process::ExitCode;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use clap::Parser;
use sqcq_target::daemon::SHUTDOWN_GRACE;
use sqcq_target::registry::{Registry, ReloadReport};
use sqcq_target::rpc::{NOT_SUPPORTED, ReloadPhase, RpcError};
use sqcq_target::runtime::error_chain;
use sqcq_target::service::ServiceEnv;
use sqcq_target::service::notify::{Notifier, NotifyState};
use sqcq_target::service::pidfile::Pidfile;
use sqcq_target::{Cli, Daemon};
use tracing::{error, info, warn};

fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == "admin") {
        return admin();
    }
    if std::env::args_os().nth(1).is_some_and(|a| a == "rpc") {
        return rpc();
    }
    if std::env::args_os().nth(1).is_some_and(|a| a == "top") {
        return top();
    }
    // Words an operator tries before the options.
    match std::env::args_os()
        .nth(1)
        .as_deref()
        .and_then(|a| a.to_str())
    {
        Some("version") => {
            println!("sqcqd {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Some("help") => {
            let _ = <Cli as clap::CommandFactory>::command().print_long_help();
            return ExitCode::SUCCESS;
        }
        Some("completions" | "man") => {
            use std::io::Write as _;
            let args: Vec<String> = std::env::args().skip(1).collect();
            return match sqcq_target::manual::run(&args) {
                Ok(text) => {
                    let _ = std::io::stdout().write_all(&text);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::from(2)
                }
            };
        }
        _ => {}
    }
    // Usage errors are clap's own (exit 2), before any log line.
    let cli = Cli::parse();
    sqcq_target::service::log::init(cli.log_level.as_deref(), cli.log_format);
    // Block SIGTERM, SIGINT and SIGHUP before any thread starts, so every
    // thread inherits the mask and only `sigwait` below receives them (a
    // SIGHUP while starting waits for it instead of killing the daemon).
    let signals = match block_signals() {
        Ok(s) => s,
        Err(e) => {
            error!("cannot block signals: {e}");
            return ExitCode::FAILURE;
        }
    };
    let from_file = cli.config.is_some();
    // SAFETY: no other thread has started yet (the logger starts none).
    let service = unsafe { ServiceEnv::take() };
    let notifier = Arc::new(service.notifier.unwrap_or_else(|e| {
        warn!("{}: readiness will not be reported", error_chain(&e));
        Notifier::none()
    }));
    let config = match cli.into_config() {
        Ok(c) => c,
        Err(e) => return failed(&notifier, ExitCode::from(2), &error_chain(&e)),
    };
    let sockets = match service.sockets {
        Ok(s) => s,
        Err(e) => return failed(&notifier, ExitCode::FAILURE, &error_chain(&e)),
    };
    // Taken before any socket is bound: a second daemon with the same
    // pidfile stops here, with the pidfile's error.
    let pidfile = match config
        .service
        .pidfile
        .as_deref()
        .map(Pidfile::create)
        .transpose()
    {
        Ok(p) => p,
        Err(e) => return failed(&notifier, ExitCode::FAILURE, &error_chain(&e)),
    };
    let stopper = match Stopper::spawn() {
        Ok(s) => s,
        Err(e) => {
            let why = format!("cannot start the shutdown thread: {e}");
            return failed(&notifier, ExitCode::FAILURE, &why);
        }
    };
    // The poll clock chooses its counter (reading /sys) and measures the
    // TSC's rate now, before any worker polls or a filter is applied.
    info!(source = %sqcq_protocol::clock::source(), "poll clock");
    let daemon = match Daemon::start_with(&config, sockets) {
        Ok(d) => d,
        Err(e) => return failed(&notifier, ExitCode::FAILURE, &error_chain(&e)),
    };
    // A reload (SIGHUP, the config_reload method) reads the command line
    // and the file it names again.
    if from_file {
        daemon.set_config_source(Box::new(|| {
            Cli::try_parse_from(std::env::args_os())
                .map_err(|e| sqcq_target::config::ConfigError::Invalid(e.to_string()))?
                .into_config()
        }));
        // A reload through the API is told to the service manager as
        // SIGHUP's are (systemd allows a service to start one itself).
        let (notifier, registry) = (Arc::clone(&notifier), Arc::clone(daemon.registry()));
        daemon.set_reload_hook(Box::new(move |phase| match phase {
            ReloadPhase::Started => reloading(&notifier),
            ReloadPhase::Done(result) => reloaded(&notifier, &registry, "config_reload", result),
        }));
    }
    // Every configured socket listens and every configured thread runs:
    // from here on the daemon serves, and changes only through its
    // management API.
    if let Err(e) = daemon.apply_sandbox(config.seccomp) {
        daemon.shutdown();
        return failed(&notifier, ExitCode::FAILURE, &error_chain(&e));
    }
    if config.seccomp != sqcq_target::sandbox::SeccompMode::Off {
        info!(mode = %config.seccomp, "seccomp filter applied to every thread");
    }
    notify(
        &notifier,
        &[
            NotifyState::Ready,
            NotifyState::Status(&serving(daemon.registry())),
        ],
    );
    loop {
        match wait_signal(&signals) {
            libc::SIGHUP => reload(&daemon, &notifier),
            signal => {
                info!(
                    "{}: stopping (finishing in-flight I/O)",
                    signal_name(signal)
                );
                notify(
                    &notifier,
                    &[
                        NotifyState::Stopping,
                        NotifyState::Status("stopping: finishing in-flight I/O"),
                    ],
                );
                let code = stopper.stop(daemon, SHUTDOWN_GRACE + SHUTDOWN_MARGIN);
                // Removed once the daemon is gone, not before.
                drop(pidfile);
                return code;
            }
        }
    }
}

/// SIGHUP: reads the command line and the configuration file again and
/// applies what can change at run time, as the `config_reload` method
/// does ([`Daemon::reload_source`]; each change is logged as
/// `reload: ...`). Never stops the daemon.
fn reload(daemon: &Daemon, notifier: &Notifier) {
    info!("SIGHUP: reload");
    reloading(notifier);
    let result = daemon.reload_source();
    reloaded(notifier, daemon.registry(), "SIGHUP", &result);
}

/// Tells the service manager that a reload begins.
fn reloading(notifier: &Notifier) {
    let mut states = vec![
        NotifyState::Reloading,
        NotifyState::Status("reloading the configuration"),
    ];
    // systemd 253 and later want the time with RELOADING=1.
    states.extend(NotifyState::monotonic_usec_now().ok());
    notify(notifier, &states);
}

/// Logs how the reload `who` asked for ended and tells the service
/// manager.
fn reloaded(
    notifier: &Notifier,
    registry: &Registry,
    who: &str,
    result: &Result<ReloadReport, RpcError>,
) {
    let failure = match result {
        Ok(report) if report.errors.is_empty() => {
            info!(changed = report.changed.len(), "{who}: reload done");
            None
        }
        Ok(report) => {
            warn!(
                changed = report.changed.len(),
                errors = report.errors.len(),
                "{who}: the reload failed"
            );
            Some(report.errors.join("; "))
        }
        // Started without a file: nothing was asked to change.
        Err(e) if e.code == NOT_SUPPORTED => {
            warn!("{who}: {}", e.message);
            None
        }
        Err(e) => {
            warn!("{who}: the reload failed: {}", e.message);
            Some(e.message.clone())
        }
    };
    // READY=1 ends the reload whatever its outcome: the daemon serves on
    // (with what it had, and any change that did apply), and systemd has
    // no message for a failed reload; without READY=1 `systemctl reload`
    // would wait for its timeout. The status says what went wrong.
    let status = match failure {
        None => serving(registry),
        Some(why) => format!("reload failed: {why}; {}", serving(registry)),
    };
    notify(
        notifier,
        &[NotifyState::Ready, NotifyState::Status(&status)],
    );
}

/// The status line: "serving 2 devices, 1 worker".
fn serving(registry: &Registry) -> String {
    format!(
        "serving {}, {}",
        count(registry.ids().len(), "device"),
        count(registry.pool().len(), "worker")
    )
}

/// Sends `states` to the service manager; a failure is only logged.
fn notify(notifier: &Notifier, states: &[NotifyState<'_>]) {
    if let Err(e) = notifier.notify(states) {
        warn!("{}", error_chain(&e));
    }
}

/// Logs why the daemon cannot start, tells the service manager, returns
/// `code`.
fn failed(notifier: &Notifier, code: ExitCode, why: &str) -> ExitCode {
    error!("{why}");
    notify(
        notifier,
        &[NotifyState::Status(&format!("failed to start: {why}"))],
    );
    code
}

/// "1 device", "2 devices".
fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// Time allowed for the daemon's threads to end after the grace period.
const SHUTDOWN_MARGIN: Duration = Duration::from_secs(5);

/// A thread, started before anything else, that stops the daemon when
/// told to (so that a stop never depends on creating a thread).
struct Stopper {
    daemon: mpsc::Sender<Daemon>,
    done: mpsc::Receiver<()>,
}

impl Stopper {
    fn spawn() -> std::io::Result<Self> {
        let (daemon, take) = mpsc::channel::<Daemon>();
        let (done_tx, done) = mpsc::channel();
        std::thread::Builder::new()
            .name("sqcq-shutdown".into())
            .spawn(move || {
                if let Ok(d) = take.recv() {
                    d.shutdown();
                    let _ = done_tx.send(());
                }
            })?;
        Ok(Stopper { daemon, done })
    }

    /// Stops the daemon; if that takes longer than `bound` (a bug: every
    /// wait of the shutdown path is bounded), exits anyway with an error.
    fn stop(self, daemon: Daemon, bound: Duration) -> ExitCode {
        if self.daemon.send(daemon).is_err() {
            error!("the shutdown thread is gone");
            return ExitCode::FAILURE;
        }
        match self.done.recv_timeout(bound) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => {
                error!("shutdown did not finish within {bound:?}: exiting anyway");
                ExitCode::FAILURE
            }
        }
    }
}

/// `sqcqd admin`, the client of the text commands the admin socket no
/// longer takes: says what replaces it and fails.
fn admin() -> ExitCode {
    eprintln!(
        "sqcqd admin was removed: use sqcqd rpc --admin-socket PATH METHOD [key=value]...\n\
         (sqcqd rpc --admin-socket PATH rpc.discover lists the methods; sqcqd rpc --help).\n\
         lun add -> lun_add, lun remove -> lun_remove, lun resize -> lun_resize,\n\
         stats -> stats_get and device_list, fault break -> fault_break"
    );
    ExitCode::from(2)
}

/// `sqcqd rpc --admin-socket PATH METHOD [PARAMS]...`: prints the result
/// as JSON; exits 0 on a result, 1 on an error answer or a `config_reload`
/// that reports errors (printed on stderr), 2 when the daemon could not be
/// asked.
fn rpc() -> ExitCode {
    use sqcq_target::client::{Request, RpcCli};
    use sqcq_target::rpc::{call, reload_errors};
    use std::io::Write as _;
    let cli = RpcCli::parse_from(
        std::iter::once(std::ffi::OsString::from("sqcqd rpc")).chain(std::env::args_os().skip(2)),
    );
    let (method, params) = match cli.request() {
        Ok(Request::Call(method, params)) => (method, params),
        Ok(Request::Follow { only, count }) => return follow_events(&cli.socket(), &only, count),
        Ok(Request::Help(text)) => {
            let _ = write!(std::io::stdout(), "{text}");
            return ExitCode::SUCCESS;
        }
        Ok(Request::Table(_, params)) => {
            let socket = cli.socket();
            return match sqcq_target::client::stats_table(&socket, &params) {
                Ok(text) => {
                    let _ = write!(std::io::stdout(), "{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("sqcqd rpc: {}: {}", socket.display(), error_chain(&e));
                    match e {
                        sqcq_target::client::FetchError::Unreachable(_) => ExitCode::from(2),
                        _ => ExitCode::FAILURE,
                    }
                }
            };
        }
        Err(e) => {
            eprintln!("sqcqd rpc: {e}");
            return ExitCode::from(2);
        }
    };
    let socket = cli.socket();
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    match call(&socket, &method, params) {
        // A closed pipe (`| head`) is not an error of the call.
        Ok(Ok(result)) => {
            let _ = writeln!(std::io::stdout(), "{}", pretty(&result));
            match reload_errors(&method, &result) {
                Some(errors) => {
                    let mut err = std::io::stderr().lock();
                    let _ = writeln!(err, "sqcqd rpc: the reload failed:");
                    for e in errors {
                        let _ = writeln!(err, "  {}", e.as_str().unwrap_or_default());
                    }
                    ExitCode::FAILURE
                }
                None => ExitCode::SUCCESS,
            }
        }
        Ok(Err(error)) => {
            let _ = writeln!(std::io::stderr(), "{}", pretty(&error));
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("sqcqd rpc: {}: {e}", socket.display());
            ExitCode::from(2)
        }
    }
}

/// `sqcqd rpc events`: prints each event's parameters on a line; exits 0
/// after `count` events, 1 when the daemon refused or went away, 2 when
/// it could not be asked.
fn follow_events(socket: &std::path::Path, only: &[String], count: Option<u64>) -> ExitCode {
    use std::io::Write as _;
    let mut left = count;
    let mut out = std::io::stdout().lock();
    let followed = sqcq_target::rpc::follow_events(socket, only, |event| {
        // A closed pipe (`| head`) ends the loop.
        let written = writeln!(out, "{event}").and_then(|()| out.flush()).is_ok();
        if let Some(n) = left.as_mut() {
            *n = n.saturating_sub(1);
        }
        written && left != Some(0)
    });
    match followed {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(error)) => {
            eprintln!("sqcqd rpc events: {error}");
            ExitCode::FAILURE
        }
        Err(e) if e.kind() == std::io::ErrorKind::Other => {
            eprintln!("sqcqd rpc events: {}: {e}", socket.display());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("sqcqd rpc events: {}: {e}", socket.display());
            ExitCode::from(2)
        }
    }
}

/// `sqcqd top [--admin-socket PATH] [--interval SECS] [--iterations N]
/// [--batch]`: exits 0 when asked to (q, a signal, the frames counted),
/// 2 when the daemon cannot be reached (or is gone), 1 on another error,
/// each with one line on stderr.
fn top() -> ExitCode {
    use sqcq_target::client::top::{TopCli, run};
    let cli = TopCli::parse_from(
        std::iter::once(std::ffi::OsString::from("sqcqd top")).chain(std::env::args_os().skip(2)),
    );
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sqcqd top: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn block_signals() -> std::io::Result<libc::sigset_t> {
    // SAFETY: an all-zero sigset_t is a valid argument for sigemptyset,
    // which initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned by this frame.
    unsafe { libc::sigemptyset(&mut set) };
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: `set` was initialised by sigemptyset.
        unsafe { libc::sigaddset(&mut set, sig) };
    }
    // SAFETY: `set` is initialised; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(set)
}

/// A signal's name, as an operator writes it (`kill -TERM`).
fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGINT => "SIGINT".into(),
        libc::SIGHUP => "SIGHUP".into(),
        n => format!("signal {n}"),
    }
}

fn wait_signal(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    loop {
        // SAFETY: `set` is an initialised signal set, `sig` a valid out
        // pointer.
        if unsafe { libc::sigwait(set, &mut sig) } == 0 {
            return sig;
        }
    }
}
