//! A device: one vhost-user socket, served by one control thread.
//!
//! The control thread owns the listening socket and, while a frontend is
//! connected, the `Session`: it waits in one epoll set for vhost-user
//! messages, for the kicks of the queues the device serves on this thread
//! (virtio-scsi's control and event queues), for the device's notifier
//! (event reports from other threads) and for the stop signal. When the
//! frontend disconnects it stops every queue, forgets the connection (for
//! SCSI, a new one is a new I_T nexus) and accepts the next frontend on
//! the same socket.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};

use thiserror::Error;
use tracing::{error, info, warn};
use vhost::vhost_user::{BackendReqHandler, Error as VhostError};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::guest_warn;
use crate::runtime::events::{Event, EventBus};
use crate::runtime::metrics::DeviceMetrics;
use crate::runtime::placement::QueuePlacement;
use crate::runtime::qos::Qos;
use crate::runtime::queue::DeviceInfo;
use crate::runtime::ratelimit::{DEFAULT_BURST, RateLimiter};
use crate::runtime::stoppable::StoppableThread;
use crate::runtime::worker::WorkerPool;
use crate::transport::backend_channel;
pub use crate::transport::device_type::DeviceParams;
use crate::transport::device_type::VirtioDevice;
use crate::transport::listen::ListeningSocket;
use crate::transport::memory::GuardedRegion;
use crate::transport::session::{MOVE_DRAIN_TIMEOUT, MoveOutcome, Session};
use crate::transport::vhost_socket::{self, MAX_UNREAD_REPLIES, MESSAGE_TIMEOUT, Wait};

const LISTEN_TOKEN: u64 = 1;
const STOP_TOKEN: u64 = 2;
const NOTIFY_TOKEN: u64 = 3;
const SOCKET_TOKEN: u64 = 4;
const CONTROL_TOKEN: u64 = 5;
const MEMORY_FAULT_TOKEN: u64 = 6;
const MANAGE_TOKEN: u64 = 7;

/// How long a management request waits for the control thread: it may be
/// finishing a vhost-user message, and a move waits for the requests in
/// flight of the queue it moves (one per attachment).
const MANAGE_TIMEOUT: std::time::Duration = MESSAGE_TIMEOUT
    .saturating_add(MOVE_DRAIN_TIMEOUT.saturating_mul(2))
    .saturating_add(std::time::Duration::from_secs(5));

/// A request to a device's control thread from the management side.
#[derive(Debug)]
enum Manage {
    /// Move running request queues to the workers assigned to them
    /// ([`Session::rebalance`]).
    Rebalance {
        /// `(vq, from, to)` of each queue moved, or why it did not.
        reply: SyncSender<Vec<MoveOutcome>>,
    },
}

/// A device's control thread did not answer a management request.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum ManageError {
    /// The control thread is gone.
    #[error("device {0}: its control thread is not running")]
    Gone(u32),
    /// It did not answer in time.
    #[error("device {0}: its control thread did not answer in time")]
    TimedOut(u32),
}

/// A way to ask a device's control thread for changes, usable without
/// holding anything else.
#[derive(Clone, Debug)]
pub struct ManageLink {
    device: u32,
    tx: Sender<Manage>,
    wake: Arc<EventFd>,
    pool: Arc<WorkerPool>,
}

impl ManageLink {
    /// Moves the running request queues whose assigned worker changed
    /// ([`DeviceShared::placement`]) to that worker, on the control
    /// thread, between two vhost-user messages; returns `(vq, from, to)`
    /// of each queue moved, or why it did not.
    pub fn rebalance(&self) -> Result<Vec<MoveOutcome>, ManageError> {
        let (reply, rx) = mpsc::sync_channel(1);
        let gone = ManageError::Gone(self.device);
        self.tx
            .send(Manage::Rebalance { reply })
            .map_err(|_| gone)?;
        self.wake.write(1).map_err(|_| gone)?;
        let wait = self
            .pool
            .deadline(MANAGE_TIMEOUT)
            .saturating_duration_since(std::time::Instant::now());
        rx.recv_timeout(wait).map_err(|e| match e {
            mpsc::RecvTimeoutError::Timeout => ManageError::TimedOut(self.device),
            mpsc::RecvTimeoutError::Disconnected => gone,
        })
    }
}

/// How often lingering guest memory of an ended connection is looked at.
const LINGER_POLL_MS: i32 = 1000;

/// Consecutive failed vhost-user messages after which a connection is
/// dropped (a frontend that only sends garbage).
const MAX_CONSECUTIVE_ERRORS: u32 = 16;

/// What the control thread and the workers of a device share.
#[derive(Debug)]
pub struct DeviceShared {
    /// Number, name, figures and log rate limiter: what the runtime knows
    /// of the device.
    pub info: Arc<DeviceInfo>,
    /// Queue parameters.
    pub params: DeviceParams,
    /// The device type.
    pub device: Arc<dyn VirtioDevice>,
    /// Written by the SIGBUS guard when a page of this device's guest
    /// memory was lost (`crate::transport::sigbus`); the control thread then drops
    /// the connection.
    pub memory_fault: EventFd,
    /// Which worker serves each request queue.
    pub placement: QueuePlacement,
    /// Whether a frontend is connected.
    pub connected: AtomicBool,
}

/// A running device.
#[derive(Debug)]
pub struct DeviceHandle {
    shared: Arc<DeviceShared>,
    manage: ManageLink,
    /// The control thread; it owns the socket and removes it when it
    /// ends.
    thread: StoppableThread,
}

impl DeviceHandle {
    /// Starts the control thread, serving `socket` (bound, or passed in
    /// by the service manager: see [`ListeningSocket`]).
    pub fn spawn(
        id: u32,
        socket: ListeningSocket,
        params: DeviceParams,
        device: Arc<dyn VirtioDevice>,
        pool: Arc<WorkerPool>,
        events: Arc<EventBus>,
    ) -> io::Result<Self> {
        let socket_path = socket.path().to_owned();
        let passed = if socket.adopted() {
            " (passed by the service manager)"
        } else {
            ""
        };
        let vrings = device.local_queues() + usize::from(device.max_request_queues());
        let info = Arc::new(DeviceInfo {
            id,
            name: socket_path.display().to_string(),
            metrics: Arc::new(DeviceMetrics::new(id, vrings)),
            limiter: RateLimiter::new(DEFAULT_BURST),
            backstore_limiter: RateLimiter::new(DEFAULT_BURST),
            events,
            qos: Qos::default(),
        });
        info.qos.set(params.qos);
        let shared = Arc::new(DeviceShared {
            info,
            placement: QueuePlacement::new(
                usize::from(device.max_request_queues()),
                &params.queue_map,
            ),
            params,
            device,
            memory_fault: EventFd::new(EFD_NONBLOCK)?,
            connected: AtomicBool::new(false),
        });
        pool.stats().register(&shared.info.metrics);
        let (manage_tx, requests) = mpsc::channel();
        let manage_wake = EventFd::new(EFD_NONBLOCK)?;
        let manage = ManageLink {
            device: id,
            tx: manage_tx,
            wake: Arc::new(manage_wake.try_clone()?),
            pool: Arc::clone(&pool),
        };
        let (control_shared, epoll) = (Arc::clone(&shared), Epoll::new()?);
        let thread = StoppableThread::spawn(
            format!("sqcq-dev{id}"),
            format!("the control thread of device {id}"),
            move |stop| {
                ControlThread {
                    shared: control_shared,
                    pool,
                    socket,
                    stop,
                    requests,
                    manage_wake,
                    epoll,
                    lingering: Vec::new(),
                }
                .run();
            },
        )?;
        info!(
            device = id,
            "listening on {}{passed}",
            socket_path.display()
        );
        Ok(DeviceHandle {
            shared,
            manage,
            thread,
        })
    }

    /// How to ask its control thread for changes.
    pub fn manage(&self) -> ManageLink {
        self.manage.clone()
    }

    /// What the device shares with its workers (number, name, figures,
    /// the device type).
    pub fn shared(&self) -> &Arc<DeviceShared> {
        &self.shared
    }

    /// Stops accepting, stops every queue after its in-flight requests,
    /// and waits for the control thread.
    pub fn shutdown(mut self) {
        self.thread.stop();
    }
}

struct ControlThread {
    shared: Arc<DeviceShared>,
    pool: Arc<WorkerPool>,
    socket: ListeningSocket,
    stop: EventFd,
    requests: Receiver<Manage>,
    manage_wake: EventFd,
    epoll: Epoll,
    /// Guest memory of ended connections something still references (a
    /// stopped queue references none: its stop waited for every request):
    /// unmapped once nothing does.
    lingering: Vec<GuardedRegion>,
}

/// Why a connection ended.
enum Ended {
    Disconnected,
    Stop,
}

impl ControlThread {
    /// Answers the management requests waiting, on `session` if a
    /// frontend is connected.
    fn manage(&self, session: Option<&Mutex<Session>>) {
        let _ = self.manage_wake.read();
        while let Ok(request) = self.requests.try_recv() {
            match request {
                Manage::Rebalance { reply } => {
                    let moved = session.map_or_else(Vec::new, |s| {
                        s.lock().unwrap_or_else(PoisonError::into_inner).rebalance()
                    });
                    let _ = reply.send(moved);
                }
            }
        }
    }

    fn watch(&self, fd: i32, token: u64) -> io::Result<()> {
        self.epoll.ctl(
            ControlOperation::Add,
            fd,
            EpollEvent::new(EventSet::IN, token),
        )
    }

    fn unwatch(&self, fd: i32) {
        let _ = self
            .epoll
            .ctl(ControlOperation::Delete, fd, EpollEvent::default());
    }

    /// The epoll timeout: none, unless lingering memory must be looked at
    /// again or the control queue has work left.
    fn timeout(&self, control_pending: bool) -> i32 {
        if control_pending {
            0
        } else if self.lingering.is_empty() {
            -1
        } else {
            LINGER_POLL_MS
        }
    }

    fn run(mut self) {
        // Writes to frontend eventfds on this thread are bounded.
        let _stall = match crate::runtime::stall::register() {
            Ok(r) => Some(r),
            Err(e) => {
                error!(device = self.shared.info.id, "stall guard: {e}");
                None
            }
        };
        let listener = self.socket.listener().as_raw_fd();
        if let Err(e) = self
            .watch(listener, LISTEN_TOKEN)
            .and_then(|()| self.watch(self.stop.as_raw_fd(), STOP_TOKEN))
            .and_then(|()| self.watch(self.shared.device.notifier(), NOTIFY_TOKEN))
            .and_then(|()| self.watch(self.shared.memory_fault.as_raw_fd(), MEMORY_FAULT_TOKEN))
            .and_then(|()| self.watch(self.manage_wake.as_raw_fd(), MANAGE_TOKEN))
        {
            error!(device = self.shared.info.id, "epoll: {e}");
            return;
        }
        let mut events = [EpollEvent::default(); 8];
        loop {
            let n = match self.epoll.wait(self.timeout(false), &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    error!(device = self.shared.info.id, "epoll_wait: {e}");
                    return;
                }
            };
            self.lingering.retain(GuardedRegion::in_use);
            for ev in &events[..n] {
                match ev.data() {
                    STOP_TOKEN => return,
                    NOTIFY_TOKEN => self.shared.device.discard_notifications(),
                    MANAGE_TOKEN => self.manage(None),
                    MEMORY_FAULT_TOKEN => {
                        // A fault of an ended connection's lingering memory.
                        let _ = self.shared.memory_fault.read();
                    }
                    LISTEN_TOKEN => match self.socket.listener().accept() {
                        Ok((stream, _)) => {
                            // One frontend at a time: another one waits in
                            // the backlog until this one disconnects.
                            self.unwatch(listener);
                            if let Ended::Stop = self.serve(stream) {
                                return;
                            }
                            if let Err(e) = self.watch(listener, LISTEN_TOKEN) {
                                error!(device = self.shared.info.id, "epoll: {e}");
                                return;
                            }
                        }
                        Err(e) => warn!(device = self.shared.info.id, "accept: {e}"),
                    },
                    _ => {}
                }
            }
        }
    }

    fn serve(&mut self, stream: UnixStream) -> Ended {
        let session = match Session::new(Arc::clone(&self.shared), Arc::clone(&self.pool)) {
            Ok(s) => Arc::new(Mutex::new(s)),
            Err(e) => {
                error!(
                    device = self.shared.info.id,
                    "cannot set up connection: {e}"
                );
                return Ended::Disconnected;
            }
        };
        // Only this thread locks the session (BackendReqHandler needs the
        // Mutex); a poisoned lock would mean a panic on this thread.
        let control_fd = session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .device
            .epoll_fd();
        info!(device = self.shared.info.id, "frontend connected");
        let info = &self.shared.info;
        info.events
            .publish(Event::FrontendConnected { device: info.id });
        let mut handler = BackendReqHandler::from_stream(stream, Arc::clone(&session));
        let socket_fd = handler.as_raw_fd();
        if let Err(e) = self
            .watch(socket_fd, SOCKET_TOKEN)
            .and_then(|()| self.watch(control_fd, CONTROL_TOKEN))
        {
            error!(device = self.shared.info.id, "epoll: {e}");
            self.unwatch(socket_fd);
            let _ = session
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .teardown();
            return Ended::Disconnected;
        }
        self.shared.connected.store(true, Ordering::Relaxed);
        let ended = self.connection_loop(&mut handler, &session);
        self.unwatch(socket_fd);
        self.unwatch(control_fd);
        let lingering = session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .teardown();
        self.lingering.extend(lingering);
        self.shared.connected.store(false, Ordering::Relaxed);
        ended
    }

    /// Drops a connection whose frontend misbehaved.
    fn drop_connection(&self, why: std::fmt::Arguments<'_>) -> Ended {
        DeviceMetrics::bump(&self.shared.info.metrics.dropped_connections);
        guest_warn!(
            self.shared.info.limiter,
            device = self.shared.info.id,
            "{why}: disconnecting the frontend"
        );
        Ended::Disconnected
    }

    /// Handles one vhost-user message once it has arrived whole (see
    /// [`crate::transport::vhost_socket`]); `Some` ends the connection.
    fn message(
        &self,
        handler: &mut BackendReqHandler<Mutex<Session>>,
        session: &Mutex<Session>,
        errors: &mut u32,
    ) -> Option<Ended> {
        let fd = handler.as_raw_fd();
        match vhost_socket::wait_for_message(fd, self.stop.as_raw_fd(), MESSAGE_TIMEOUT) {
            Ok(Wait::Ready) => {}
            Ok(Wait::Nothing) => return None,
            Ok(Wait::Stopped) => return Some(Ended::Stop),
            Ok(Wait::TimedOut) => {
                return Some(self.drop_connection(format_args!(
                    "message incomplete after {MESSAGE_TIMEOUT:?}"
                )));
            }
            Err(e) => return Some(self.drop_connection(format_args!("socket: {e}"))),
        }
        match vhost_socket::unread_reply_bytes(fd) {
            Ok(n) if n > MAX_UNREAD_REPLIES => {
                return Some(
                    self.drop_connection(format_args!("{n} bytes of replies left unread")),
                );
            }
            Ok(_) => {}
            Err(e) => return Some(self.drop_connection(format_args!("socket: {e}"))),
        }
        // SET_LOG_FD, which `vhost` does not dispatch: handled here.
        match backend_channel::take_log_fd(fd) {
            Ok(Some(log)) => {
                *errors = 0;
                session
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .set_log_fd(log);
                return None;
            }
            Ok(None) => {}
            Err(e) => return Some(self.drop_connection(format_args!("SET_LOG_FD: {e}"))),
        }
        // SET_BACKEND_REQ_FD: keep a duplicate of its descriptor for the
        // handler to adopt (see `backend_channel`).
        let peeked = match backend_channel::peek_backend_fd(fd) {
            Ok(p) => p,
            Err(e) => return Some(self.drop_connection(format_args!("socket: {e}"))),
        };
        let had_fd = peeked.is_some();
        if had_fd {
            session
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .peeked_backend_fd = peeked;
        }
        let handled = handler.handle_request();
        if had_fd {
            // Adopted by the handler, or refused with the message.
            session
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .peeked_backend_fd = None;
        }
        let fatal = session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .fatal
            .take();
        if let Some(why) = fatal {
            DeviceMetrics::bump(&self.shared.info.metrics.failed_messages);
            return Some(self.drop_connection(format_args!("{why}")));
        }
        match handled {
            Ok(()) => *errors = 0,
            Err(
                VhostError::Disconnected
                | VhostError::PartialMessage
                | VhostError::SocketBroken(_)
                | VhostError::SocketError(_),
            ) => return Some(Ended::Disconnected),
            // An invalid header (unknown code, oversized body, bad flags)
            // or descriptors on a message that takes none: the body may
            // still be in the socket, so nothing after it can be trusted.
            Err(e @ (VhostError::InvalidMessage | VhostError::OversizedMsg)) => {
                DeviceMetrics::bump(&self.shared.info.metrics.failed_messages);
                return Some(self.drop_connection(format_args!("malformed message ({e})")));
            }
            Err(e) => {
                *errors += 1;
                DeviceMetrics::bump(&self.shared.info.metrics.failed_messages);
                guest_warn!(
                    self.shared.info.limiter,
                    device = self.shared.info.id,
                    "vhost-user request failed: {e}"
                );
                if *errors >= MAX_CONSECUTIVE_ERRORS {
                    return Some(self.drop_connection(format_args!(
                        "{MAX_CONSECUTIVE_ERRORS} failed requests in a row"
                    )));
                }
            }
        }
        None
    }

    fn connection_loop(
        &mut self,
        handler: &mut BackendReqHandler<Mutex<Session>>,
        session: &Mutex<Session>,
    ) -> Ended {
        let mut events = [EpollEvent::default(); 8];
        let mut errors = 0u32;
        let mut control_pending = false;
        loop {
            let n = match self.epoll.wait(self.timeout(control_pending), &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    error!(device = self.shared.info.id, "epoll_wait: {e}");
                    return Ended::Stop;
                }
            };
            self.lingering.retain(GuardedRegion::in_use);
            if n == 0 && control_pending {
                session
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .with_device(|d, ctx| d.service(ctx));
            }
            for ev in &events[..n] {
                match ev.data() {
                    STOP_TOKEN => return Ended::Stop,
                    SOCKET_TOKEN => {
                        if let Some(ended) = self.message(handler, session, &mut errors) {
                            return ended;
                        }
                        session
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .release_retired();
                    }
                    MEMORY_FAULT_TOKEN => {
                        let _ = self.shared.memory_fault.read();
                        DeviceMetrics::bump(&self.shared.info.metrics.memory_faults);
                        return self.drop_connection(format_args!(
                            "guest memory lost its backing (the frontend shrank or \
                             punched its memory file)"
                        ));
                    }
                    MANAGE_TOKEN => self.manage(Some(session)),
                    CONTROL_TOKEN => session
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .with_device(|d, ctx| d.service(ctx)),
                    NOTIFY_TOKEN => session
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .with_device(|d, ctx| d.notified(ctx)),
                    _ => {}
                }
            }
            control_pending = session
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .device
                .pending();
        }
    }
}
