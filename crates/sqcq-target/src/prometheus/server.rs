//! The HTTP endpoint: one thread, started with the daemon (before the
//! seccomp filter, which allows no new thread or socket), that answers
//! `GET /metrics` on a TCP address or a Unix socket.
//!
//! Every client is taken for hostile. The thread multiplexes at most
//! [`MAX_CONNECTIONS`] connections with `poll`, so a client that never
//! sends, or reads its answer slowly, holds one slot, never the thread;
//! each connection has [`REQUEST_TIMEOUT`] from its connection to send a
//! request of at most [`MAX_REQUEST`] bytes (request line and headers,
//! parsed by `httparse`; a byte now and then does not extend it) and
//! [`RESPONSE_TIMEOUT`] to read the answer, then it is closed. The
//! listener is always served: when every slot is taken, a new connection
//! takes the slot of the one that has waited longest for its request
//! (as servers facing slowloris shed their oldest idle connections; one
//! reading its answer goes only when none is waiting), so clients holding
//! connections open, however many, delay a scrape by nothing; a scrape
//! loses its slot only if [`MAX_CONNECTIONS`] clients connect between its
//! connection and its request, which its request, read as soon as it is
//! accepted, usually beats. A request
//! that does not parse, or is too long, gets `400` and is closed; every
//! answer says `Connection: close` and the connection is closed after it.
//! Problems of a connection are logged at debug level only: a client
//! cannot fill the log.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, error, info, warn};
use vmm_sys_util::eventfd::EventFd;

use crate::runtime::stoppable::StoppableThread;
use crate::service::pollset::PollSet;

use super::MetricsListen;
use super::text::CONTENT_TYPE;
use crate::transport::listen::{ListeningSocket, SocketOwnership, StaleProbe};

/// Connections served at once (each holds at most [`MAX_REQUEST`] bytes
/// of request, or one answer).
pub const MAX_CONNECTIONS: usize = 64;
/// Longest request (request line and headers).
pub const MAX_REQUEST: usize = 8192;
/// Headers accepted in a request.
const MAX_HEADERS: usize = 32;
/// Time a client has, from its connection, to send its request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a client has to read the answer.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Appends the exposition of the daemon's figures at this moment.
pub type Render = Arc<dyn Fn(&mut String) + Send + Sync>;

/// The endpoint's thread.
#[derive(Debug)]
pub struct MetricsServer {
    thread: StoppableThread,
    endpoint: MetricsListen,
}

/// A bound, non-blocking listener.
#[derive(Debug)]
pub(crate) enum Listener {
    /// A TCP address.
    Tcp(TcpListener),
    /// A Unix socket (removed when dropped).
    Unix(ListeningSocket),
}

impl Listener {
    /// Binds `listen`; a Unix socket gets mode 0600 (a socket file at its
    /// path probed as `stale` allows). Returns the listener and where it
    /// listens (the port chosen for port 0).
    pub(crate) fn bind(
        listen: &MetricsListen,
        stale: &StaleProbe,
    ) -> io::Result<(Self, MetricsListen)> {
        let (listener, endpoint) = match listen {
            MetricsListen::Tcp(addr) => {
                let l = TcpListener::bind(addr)?;
                let bound = l.local_addr()?;
                (Listener::Tcp(l), MetricsListen::Tcp(bound))
            }
            MetricsListen::Unix(path) => {
                let private = SocketOwnership {
                    mode: Some(0o600),
                    ..SocketOwnership::default()
                };
                let s = ListeningSocket::bind(path, &private, stale).map_err(io::Error::other)?;
                (Listener::Unix(s), listen.clone())
            }
        };
        match &listener {
            Listener::Tcp(l) => l.set_nonblocking(true)?,
            Listener::Unix(s) => s.listener().set_nonblocking(true)?,
        }
        Ok((listener, endpoint))
    }

    fn fd(&self) -> RawFd {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(s) => s.listener().as_raw_fd(),
        }
    }

    fn accept(&self) -> io::Result<Stream> {
        let s = match self {
            Listener::Tcp(l) => Stream::Tcp(l.accept()?.0),
            Listener::Unix(s) => Stream::Unix(s.listener().accept()?.0),
        };
        s.set_nonblocking()?;
        Ok(s)
    }
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(true),
            Stream::Unix(s) => s.set_nonblocking(true),
        }
    }

    fn fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }

    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn shutdown_write(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Write),
            Stream::Unix(s) => s.shutdown(Shutdown::Write),
        };
    }
}

impl MetricsServer {
    /// Binds `listen` (see [`Listener::bind`] for `stale`) and serves it
    /// with `render` until shut down.
    pub fn spawn(listen: &MetricsListen, render: Render, stale: &StaleProbe) -> io::Result<Self> {
        let (listener, endpoint) = Listener::bind(listen, stale)?;
        if let MetricsListen::Tcp(addr) = endpoint
            && !addr.ip().is_loopback()
        {
            warn!("metrics endpoint on {addr}: reachable from other hosts");
        }
        // The thread owns the listener: a Unix socket is removed when it
        // ends.
        let thread = StoppableThread::spawn(
            "sqcq-metrics".into(),
            "the metrics thread".into(),
            move |stop| serve(&listener, &stop, &*render),
        )?;
        info!("metrics endpoint {}", endpoint.url());
        Ok(MetricsServer { thread, endpoint })
    }

    /// Where it listens (with the port chosen when port 0 was asked).
    pub fn endpoint(&self) -> &MetricsListen {
        &self.endpoint
    }

    /// Stops serving (closing every connection) and removes a Unix
    /// socket.
    pub fn shutdown(mut self) {
        self.thread.stop();
    }
}

/// Where a connection is.
enum State {
    /// Reading the request (what came so far).
    Reading(Vec<u8>),
    /// Writing the answer from `at`.
    Writing { answer: Vec<u8>, at: usize },
}

struct Conn {
    stream: Stream,
    /// When it connected, or its answer started: the oldest is shed
    /// first when every slot is taken.
    since: Instant,
    deadline: Instant,
    state: State,
}

/// Serves `listener` until `stop` is signalled.
pub(crate) fn serve(listener: &Listener, stop: &EventFd, render: &(dyn Fn(&mut String) + Sync)) {
    let mut conns: Vec<Conn> = Vec::with_capacity(MAX_CONNECTIONS);
    let mut fds = PollSet::with_capacity(MAX_CONNECTIONS + 2);
    loop {
        fds.clear();
        fds.push(stop.as_raw_fd(), libc::POLLIN);
        fds.push(listener.fd(), libc::POLLIN);
        for c in &conns {
            let events = match c.state {
                State::Reading(_) => libc::POLLIN,
                State::Writing { .. } => libc::POLLOUT,
            };
            fds.push(c.stream.fd(), events);
        }
        match fds.wait(conns.iter().map(|c| c.deadline).min()) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                error!("metrics endpoint: poll failed: {e}");
                return;
            }
        }
        if fds.revents(0) != 0 {
            return;
        }
        let now = Instant::now();
        let mut i = 0;
        conns.retain_mut(|c| {
            let revents = fds.revents(2 + i);
            i += 1;
            if revents != 0 && !progress(c, render) {
                return false;
            }
            if now >= c.deadline {
                debug!("metrics endpoint: connection timed out");
                return false;
            }
            true
        });
        if fds.revents(1) != 0 {
            accept(listener, &mut conns, render);
        }
    }
}

/// Accepts every connection waiting (a bounded number per call, so the
/// others are served between bursts); when every slot is taken, closes
/// the connection that has waited longest to make room. Reads a request
/// that came with the connection at once.
fn accept(listener: &Listener, conns: &mut Vec<Conn>, render: &dyn Fn(&mut String)) {
    for _ in 0..MAX_CONNECTIONS {
        let stream = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => {
                debug!("metrics endpoint: accept: {e}");
                return;
            }
        };
        // A connection still waiting for its request goes before one
        // whose answer is being read: that one was a scrape.
        if conns.len() >= MAX_CONNECTIONS
            && let Some(oldest) = (0..conns.len()).min_by_key(|&i| {
                let c = &conns[i];
                (matches!(c.state, State::Writing { .. }), c.since)
            })
        {
            debug!("metrics endpoint: full, closing the connection waiting longest");
            conns.swap_remove(oldest);
        }
        let now = Instant::now();
        let mut c = Conn {
            stream,
            since: now,
            deadline: now + REQUEST_TIMEOUT,
            state: State::Reading(Vec::new()),
        };
        if progress(&mut c, render) {
            conns.push(c);
        }
    }
}

/// Reads or writes what the connection is ready for; false when it is
/// done (answered, closed by the client, or failed).
fn progress(c: &mut Conn, render: &dyn Fn(&mut String)) -> bool {
    loop {
        match &mut c.state {
            State::Reading(buf) => {
                let mut chunk = [0u8; 1024];
                let room = MAX_REQUEST.saturating_sub(buf.len()).min(chunk.len());
                let n = match c.stream.read(&mut chunk[..room]) {
                    Ok(0) => return false,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        debug!("metrics endpoint: read: {e}");
                        return false;
                    }
                };
                buf.extend_from_slice(&chunk[..n]);
                let Some(answer) = answer(buf, render) else {
                    continue;
                };
                c.state = State::Writing { answer, at: 0 };
                c.since = Instant::now();
                c.deadline = c.since + RESPONSE_TIMEOUT;
            }
            State::Writing { answer, at } => match c.stream.write(&answer[*at..]) {
                Ok(n) => {
                    *at += n;
                    if *at >= answer.len() {
                        c.stream.shutdown_write();
                        return false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    debug!("metrics endpoint: write: {e}");
                    return false;
                }
            },
        }
    }
}

/// The answer to the request `buf` holds, `None` while it is incomplete
/// (and not too long).
fn answer(buf: &[u8], render: &dyn Fn(&mut String)) -> Option<Vec<u8>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) if buf.len() < MAX_REQUEST => return None,
        Ok(httparse::Status::Partial) | Err(_) => {
            return Some(plain(400, "Bad Request", "bad request\n"));
        }
    }
    let path = req.path.unwrap_or("");
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    Some(match req.method {
        Some("GET") if path == "/metrics" => {
            let mut body = String::with_capacity(64 << 10);
            render(&mut body);
            response(200, "OK", CONTENT_TYPE, "", body.as_bytes())
        }
        Some("GET") => plain(404, "Not Found", "not found: the metrics are at /metrics\n"),
        _ => response(
            405,
            "Method Not Allowed",
            "text/plain; charset=utf-8",
            "Allow: GET\r\n",
            b"method not allowed\n",
        ),
    })
}

fn plain(code: u16, reason: &str, body: &str) -> Vec<u8> {
    response(
        code,
        reason,
        "text/plain; charset=utf-8",
        "",
        body.as_bytes(),
    )
}

fn response(code: u16, reason: &str, content_type: &str, extra: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         {extra}Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(out: &mut String) {
        out.push_str("# TYPE up gauge\nup 1\n");
    }

    fn ask(request: &[u8]) -> String {
        String::from_utf8(answer(request, &render).expect("complete")).unwrap()
    }

    #[test]
    fn get_metrics_and_the_other_answers() {
        let ok = ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
        assert!(ok.contains("\r\nContent-Length: 21\r\n"));
        assert!(ok.contains("\r\nConnection: close\r\n"));
        assert!(ok.ends_with("\r\n\r\n# TYPE up gauge\nup 1\n"));
        let q = ask(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n");
        assert!(
            q.starts_with("HTTP/1.1 200 "),
            "query strings are ignored: {q}"
        );
        assert!(ask(b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        let post = ask(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405 ") && post.contains("\r\nAllow: GET\r\n"));
        assert!(ask(b"\x00\x01garbage\r\n\r\n").starts_with("HTTP/1.1 400 "));
        assert!(ask(b"GET /metrics HTTP/9.9\r\n\r\n").starts_with("HTTP/1.1 400 "));
    }

    #[test]
    fn an_incomplete_request_waits_until_it_is_too_long() {
        assert!(answer(b"GET /metrics HTTP/1.1\r\nHost:", &render).is_none());
        let mut long = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        long.resize(MAX_REQUEST, b'a');
        let a = String::from_utf8(answer(&long, &render).unwrap()).unwrap();
        assert!(a.starts_with("HTTP/1.1 400 "), "{a}");
    }
}
