//! The admin socket's server: one thread, started with the daemon, that
//! multiplexes up to [`MAX_CONNECTIONS`] clients with `poll`, and runs
//! each JSON-RPC line on a thread of its own, which hands the reply back.
//!
//! A request never runs on the server's thread, so one that takes long (a
//! `device_create` whose RBD image waits for the cluster's connect
//! time-out) holds no other client's call: reads answer at once, and the
//! registry serialises changes (with SIGHUP's reload too) but for the
//! opening of backstores. Each change still replies once it reached every
//! worker. A client that is not sending a request costs the others
//! nothing: the thread only waits in `poll`, never on one connection.
//! Each client has one request running at most: its next line is read
//! only once the reply to the last one is written, so its lines run in
//! their order and a client that does not read its replies holds one
//! reply in memory. At most [`MAX_RUNNING`] requests run at once.
//!
//! A connection that subscribed to events (`events_subscribe`) is sent
//! them as JSON-RPC notifications between its replies, from a queue of
//! its own of at most [`QUEUE_LEN`](crate::runtime::events::QUEUE_LEN)
//! (see [`crate::runtime::events`]); it may stay idle as long as it
//! likes, but must read what is sent within [`IDLE_TIMEOUT`].
//!
//! A connection must complete a request line within [`IDLE_TIMEOUT`] of
//! its connection or of its last request (a byte now and then does not
//! extend it), and read a reply within as long, or it is closed. When
//! every place is taken, a new connection takes the place of the one idle
//! longest (without a reply being written, if there is one), which is
//! closed as if its time were up: clients holding connections open,
//! however many, never lock management out.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

use tracing::{debug, error, info, warn};
use vmm_sys_util::eventfd::EventFd;

use crate::rpc::{Connection, Context};
use crate::runtime::ratelimit::RateLimiter;
use crate::runtime::stoppable::StoppableThread;
use crate::service::pollset::PollSet;
use crate::transport::listen::ListeningSocket;

/// Clients served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Longest line accepted (a JSON-RPC request creating a device with
/// dozens of LUNs fits).
pub const MAX_LINE: usize = 64 << 10;
/// How long a connection may go without a request, or leave a reply
/// unread, before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Requests running at once (a client whose connection was closed while
/// its request ran leaves it running, so this may exceed the
/// connections).
pub const MAX_RUNNING: usize = MAX_CONNECTIONS;
/// Bytes read from a connection per turn.
const CHUNK: usize = 4096;

/// The admin socket's thread.
#[derive(Debug)]
pub struct AdminServer {
    thread: StoppableThread,
}

impl AdminServer {
    /// Serves `socket` (bound with the admin socket's ownership, by
    /// default mode 0600, or passed in by the service manager).
    pub fn spawn(socket: ListeningSocket, ctx: Arc<Context>) -> io::Result<Self> {
        let path = socket.path().to_owned();
        socket.listener().set_nonblocking(true)?;
        // The thread owns the socket: it is removed when the thread ends.
        let thread = StoppableThread::spawn(
            "sqcq-admin".into(),
            "the admin thread".into(),
            move |stop| serve(socket.listener(), &stop, &ctx),
        )?;
        info!("admin socket {}", path.display());
        Ok(AdminServer { thread })
    }

    /// Stops serving, closes every connection and removes the socket.
    /// Requests running go on without a client: those that change
    /// something are refused once the registry shut down.
    pub fn shutdown(mut self) {
        self.thread.stop();
    }
}

/// One client.
struct Conn {
    /// Names it to the thread running its request.
    id: u64,
    /// What its requests may change of it (its subscription).
    state: Arc<Connection>,
    stream: UnixStream,
    /// What came and is not served yet.
    input: Vec<u8>,
    /// The reply being written, from `written`.
    output: Vec<u8>,
    written: usize,
    /// Its connection or its last request: the longest idle is closed
    /// first when every place is taken.
    since: Instant,
    deadline: Instant,
    /// The client shut its side: its lines are served, then it is closed.
    eof: bool,
    /// Closed once the reply is written (its line was too long).
    closing: bool,
    /// Its request runs.
    running: bool,
}

impl Conn {
    fn new(id: u64, stream: UnixStream, wake: &Arc<EventFd>) -> Self {
        let now = Instant::now();
        Conn {
            id,
            state: Arc::new(Connection::new(Arc::clone(wake))),
            stream,
            input: Vec::new(),
            output: Vec::new(),
            written: 0,
            since: now,
            deadline: now + IDLE_TIMEOUT,
            eof: false,
            closing: false,
            running: false,
        }
    }

    fn replying(&self) -> bool {
        self.written < self.output.len()
    }

    /// A whole line is there to serve now.
    fn has_line(&self) -> bool {
        !self.running && !self.replying() && !self.closing && self.input.contains(&b'\n')
    }

    /// What to wait for: to write the reply, or to read (once the lines
    /// received are served); nothing else.
    fn events(&self) -> libc::c_short {
        if self.replying() {
            libc::POLLOUT
        } else if self.running || self.eof || self.closing || self.has_line() {
            0
        } else {
            libc::POLLIN
        }
    }

    /// Reads what came (one chunk); false when the connection failed.
    fn read(&mut self) -> bool {
        let mut chunk = [0u8; CHUNK];
        match self.stream.read(&mut chunk) {
            Ok(0) => self.eof = true,
            Ok(n) => self.input.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => {
                debug!("admin connection: read: {e}");
                return false;
            }
        }
        true
    }

    /// Writes what it can of the reply; false when the connection failed.
    fn write(&mut self) -> bool {
        while self.replying() {
            match self.stream.write(&self.output[self.written..]) {
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    debug!("admin connection: write: {e}");
                    return false;
                }
            }
        }
        self.output.clear();
        self.written = 0;
        true
    }

    /// Whether it waits for events (then only a reply it does not read
    /// times it out).
    fn subscribed(&self) -> bool {
        self.state.subscription().is_some()
    }

    /// Sends the events queued for it, between two replies; false when
    /// the connection failed.
    fn send_events(&mut self, now: Instant) -> bool {
        if self.running || self.replying() || self.closing {
            return true;
        }
        let Some(sub) = self.state.subscription() else {
            return true;
        };
        self.output.clear();
        self.written = 0;
        if !sub.take(&mut self.output) {
            return true;
        }
        self.deadline = now + IDLE_TIMEOUT;
        self.write()
    }

    /// Queues `reply` (a line) and writes what it can of it.
    fn reply(&mut self, reply: &str) -> bool {
        self.output.clear();
        self.output.extend_from_slice(reply.as_bytes());
        self.output.push(b'\n');
        self.written = 0;
        self.write()
    }

    /// The next whole line, if it is its turn.
    fn next_line(&mut self) -> Option<String> {
        if !self.has_line() {
            return None;
        }
        let end = self.input.iter().position(|b| *b == b'\n')?;
        let line: Vec<u8> = self.input.drain(..=end).collect();
        Some(String::from_utf8_lossy(&line).into_owned())
    }
}

/// A reply from a request's thread: the connection, the reply line.
type Reply = (u64, Option<String>);

/// The requests running on their threads.
struct Running {
    count: usize,
    replies: Receiver<Reply>,
    tx: Sender<Reply>,
    /// Written by a request's thread once its reply is sent.
    done: Arc<EventFd>,
}

impl Running {
    fn new() -> io::Result<Self> {
        let (tx, replies) = mpsc::channel();
        Ok(Running {
            count: 0,
            replies,
            tx,
            done: Arc::new(EventFd::new(libc::EFD_NONBLOCK)?),
        })
    }

    fn full(&self) -> bool {
        self.count >= MAX_RUNNING
    }

    /// Runs `line` of connection `conn` on a thread of its own.
    fn start(&mut self, conn: &Conn, line: String, ctx: &Arc<Context>) -> io::Result<()> {
        let (ctx, tx, done) = (Arc::clone(ctx), self.tx.clone(), Arc::clone(&self.done));
        let (id, state) = (conn.id, Arc::clone(&conn.state));
        std::thread::Builder::new()
            .name("sqcq-rpc".into())
            .spawn(move || {
                // A request that panics still answers, and frees its place.
                let reply = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    crate::rpc::handle_line_on(&ctx, &state, &line)
                }))
                .unwrap_or_else(|_| {
                    let e = io::Error::other("the request panicked");
                    Some(crate::rpc::internal_error(&e))
                });
                // The server may be gone (shut down): then no one waits.
                if tx.send((id, reply)).is_ok() {
                    let _ = done.write(1);
                }
            })?;
        self.count += 1;
        Ok(())
    }
}

/// Serves `listener` (non-blocking) until `stop` is signalled.
fn serve(listener: &UnixListener, stop: &EventFd, ctx: &Arc<Context>) {
    let mut running = match Running::new() {
        Ok(r) => r,
        Err(e) => {
            error!("admin socket: {e}");
            return;
        }
    };
    let events = match EventFd::new(libc::EFD_NONBLOCK) {
        Ok(e) => Arc::new(e),
        Err(e) => {
            error!("admin socket: {e}");
            return;
        }
    };
    let mut conns: Vec<Conn> = Vec::with_capacity(MAX_CONNECTIONS);
    let mut fds = PollSet::with_capacity(MAX_CONNECTIONS + FIRST_CONN);
    let shed_log = RateLimiter::new(1);
    let mut next_id = 0u64;
    loop {
        fds.clear();
        fds.push(stop.as_raw_fd(), libc::POLLIN);
        fds.push(listener.as_raw_fd(), libc::POLLIN);
        fds.push(running.done.as_raw_fd(), libc::POLLIN);
        fds.push(events.as_raw_fd(), libc::POLLIN);
        for c in &conns {
            fds.push(c.stream.as_raw_fd(), c.events());
        }
        // Lines already received are started without waiting (when
        // another request may run).
        let deadline = if !running.full() && conns.iter().any(Conn::has_line) {
            Some(Instant::now())
        } else {
            // Neither a request running nor a line waiting for one to
            // end is timed: `done` wakes the thread for them.
            (conns.iter())
                .filter(|c| !c.running && !c.has_line() && (c.replying() || !c.subscribed()))
                .map(|c| c.deadline)
                .min()
        };
        match fds.wait(deadline) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                error!("admin socket: poll failed: {e}");
                return;
            }
        }
        if fds.revents(0) != 0 {
            return;
        }
        let now = Instant::now();
        let mut i = 0;
        conns.retain_mut(|c| {
            let revents = fds.revents(FIRST_CONN + i);
            i += 1;
            turn(c, revents, now, ctx, &mut running)
        });
        if fds.revents(1) != 0 {
            accept(listener, &mut conns, &shed_log, &mut next_id, &events);
        }
        if fds.revents(2) != 0 {
            let _ = running.done.read();
        }
        if fds.revents(3) != 0 {
            let _ = events.read();
        }
        while let Ok((id, reply)) = running.replies.try_recv() {
            running.count -= 1;
            // Its connection may have been closed meanwhile.
            if let Some(i) = conns.iter().position(|c| c.id == id) {
                let c = &mut conns[i];
                c.running = false;
                // The time the request took is not the client's.
                c.since = Instant::now();
                c.deadline = c.since + IDLE_TIMEOUT;
                if !reply.is_none_or(|r| c.reply(&r)) {
                    conns.swap_remove(i);
                }
            }
        }
        // Between replies: the events queued meanwhile.
        let now = Instant::now();
        conns.retain_mut(|c| c.send_events(now));
    }
}

/// Index of the first connection in the poll set (after the stop signal,
/// the listener, the requests' and the events' eventfds).
const FIRST_CONN: usize = 4;

/// One turn of a connection: writes or reads what it is ready for and
/// starts at most one line. False once it is to be closed.
fn turn(
    c: &mut Conn,
    revents: libc::c_short,
    now: Instant,
    ctx: &Arc<Context>,
    running: &mut Running,
) -> bool {
    if c.running {
        // Only a hang-up or an error can be reported (nothing is waited
        // for): the client is gone, and its reply will go nowhere.
        return revents == 0;
    }
    if revents != 0 {
        let ok = if c.replying() { c.write() } else { c.read() };
        if !ok {
            return false;
        }
    }
    if !c.replying() && !c.closing && !c.has_line() && c.input.len() > MAX_LINE {
        c.closing = true;
        return c.reply(&crate::rpc::line_too_long(MAX_LINE)) && c.replying();
    }
    if !running.full()
        && let Some(line) = c.next_line()
    {
        if line.trim().is_empty() {
            return true;
        }
        return match running.start(c, line, ctx) {
            Ok(()) => {
                c.running = true;
                true
            }
            Err(e) => {
                warn!("admin socket: cannot start a request: {e}");
                c.reply(&crate::rpc::internal_error(&e))
            }
        };
    }
    if c.replying() {
        return now < c.deadline;
    }
    if c.has_line() {
        // Waits for a request to end.
        return true;
    }
    if c.closing || c.eof {
        return false;
    }
    if now >= c.deadline && !c.subscribed() {
        debug!("admin connection: idle for {IDLE_TIMEOUT:?}, closed");
        return false;
    }
    true
}

/// Accepts the connections waiting (a bounded number per turn, so the
/// others are served between bursts); when every place is taken, closes
/// the connection idle longest to make room.
fn accept(
    listener: &UnixListener,
    conns: &mut Vec<Conn>,
    shed_log: &RateLimiter,
    next_id: &mut u64,
    events: &Arc<EventFd>,
) {
    for _ in 0..MAX_CONNECTIONS {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => {
                warn!("admin accept: {e}");
                return;
            }
        };
        if let Err(e) = stream.set_nonblocking(true) {
            warn!("admin accept: {e}");
            continue;
        }
        // One whose request runs goes last, then one still reading its
        // reply, then one following events.
        if conns.len() >= MAX_CONNECTIONS
            && let Some(idle) = (0..conns.len()).min_by_key(|&i| {
                let c = &conns[i];
                (c.running, c.replying(), c.subscribed(), c.since)
            })
        {
            let permit = shed_log.check();
            if permit.allowed {
                warn!(
                    suppressed = permit.suppressed_before,
                    "admin socket: {MAX_CONNECTIONS} connections open: closing the one idle longest"
                );
            }
            conns.swap_remove(idle);
        }
        *next_id += 1;
        conns.push(Conn::new(*next_id, stream, events));
    }
}
