//! A device: one vhost-user socket, served by one control thread.
//!
//! The control thread owns the listening socket and, while a frontend is
//! connected, the [`Session`]: it waits in one epoll set for vhost-user
//! messages, for the kicks of the control and event queues, for event
//! reports from the embedding program and for the stop signal. When the
//! frontend disconnects it stops every queue, forgets the connection (a
//! new one is a new I_T nexus) and accepts the next frontend on the same
//! socket.

use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::{fs, io};

use tracing::{error, info, warn};
use vhost::vhost_user::{BackendReqHandler, Error as VhostError};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::config::{DeviceConfig, QueueMap};
use crate::counters::DeviceCounters;
use crate::hotplug::{EventSender, LunTable};
use crate::ratelimit::{DEFAULT_BURST, RateLimiter};
use crate::session::{CONTROL_VQ, EVENT_VQ, Session};
use crate::target::Target;
use crate::worker::WorkerPool;

const LISTEN_TOKEN: u64 = 1;
const STOP_TOKEN: u64 = 2;
const NOTIFY_TOKEN: u64 = 3;
const SOCKET_TOKEN: u64 = 4;
const CONTROL_TOKEN: u64 = 5;

/// Consecutive failed vhost-user messages after which a connection is
/// dropped (a frontend that only sends garbage).
const MAX_CONSECUTIVE_ERRORS: u32 = 16;

/// Queue parameters of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceParams {
    /// Request queues announced.
    pub num_queues: u16,
    /// Largest queue size accepted.
    pub queue_size: u16,
    /// Request queue to worker map.
    pub queue_map: QueueMap,
}

/// What the control thread and the workers of a device share.
#[derive(Debug)]
pub struct DeviceShared {
    /// Device number.
    pub id: u32,
    /// Name for logs (the socket path).
    pub name: String,
    /// Queue parameters.
    pub params: DeviceParams,
    /// The logical units (the current snapshot; workers hold their own).
    pub target: LunTable,
    /// Error counters.
    pub counters: DeviceCounters,
    /// Rate limiter of guest-triggered log messages.
    pub limiter: RateLimiter,
}

/// An event to report to the driver (virtio-scsi event queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventReport {
    /// The LUN concerned.
    pub lun: u16,
    /// `VIRTIO_SCSI_T_TRANSPORT_RESET` or `VIRTIO_SCSI_T_PARAM_CHANGE`.
    pub event: u32,
    /// Reason code.
    pub reason: u32,
}

/// A running device.
#[derive(Debug)]
pub struct DeviceHandle {
    shared: Arc<DeviceShared>,
    socket_path: PathBuf,
    stop: EventFd,
    notify: EventFd,
    events: Sender<EventReport>,
    thread: Option<JoinHandle<()>>,
}

impl DeviceHandle {
    /// Binds the socket (removing a stale one) and starts the control
    /// thread.
    pub fn spawn(
        id: u32,
        config: &DeviceConfig,
        target: Target,
        pool: Arc<WorkerPool>,
    ) -> io::Result<Self> {
        let path = config.socket_path.clone();
        match fs::remove_file(&path) {
            Ok(()) => info!("removed stale socket {}", path.display()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(&path)?;
        let shared = Arc::new(DeviceShared {
            id,
            name: path.display().to_string(),
            params: DeviceParams {
                num_queues: config.num_queues,
                queue_size: config.queue_size,
                queue_map: config.queue_map.clone(),
            },
            target: LunTable::new(target),
            counters: DeviceCounters::default(),
            limiter: RateLimiter::new(DEFAULT_BURST),
        });
        for e in shared.target.current().luns() {
            info!(device = id, lun = e.lun, geometry = ?e.backstore.geometry(), "LUN ready");
        }
        let stop = EventFd::new(EFD_NONBLOCK)?;
        let notify = EventFd::new(EFD_NONBLOCK)?;
        let (events, rx) = mpsc::channel();
        let control = ControlThread {
            shared: Arc::clone(&shared),
            pool,
            listener,
            stop: stop.try_clone()?,
            notify: notify.try_clone()?,
            events: rx,
            epoll: Epoll::new()?,
        };
        let thread = std::thread::Builder::new()
            .name(format!("sqcq-dev{id}"))
            .spawn(move || control.run())?;
        info!(device = id, "listening on {}", path.display());
        Ok(DeviceHandle {
            shared,
            socket_path: path,
            stop,
            notify,
            events,
            thread: Some(thread),
        })
    }

    /// What the device shares with its workers (counters, LUNs).
    pub fn shared(&self) -> &Arc<DeviceShared> {
        &self.shared
    }

    /// Reports an event to the connected driver, if any.
    pub fn report_event(&self, event: EventReport) {
        if self.events.send(event).is_ok() {
            let _ = self.notify.write(1);
        }
    }

    /// A sender of event reports for another thread (the admin socket).
    pub fn event_sender(&self) -> io::Result<EventSender> {
        Ok(EventSender::new(
            self.events.clone(),
            self.notify.try_clone()?,
        ))
    }

    /// Stops accepting, stops every queue after its in-flight requests,
    /// and waits for the control thread.
    pub fn shutdown(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            error!(device = self.shared.id, "control thread panicked");
        }
        let _ = fs::remove_file(&self.socket_path);
    }
}

impl Drop for DeviceHandle {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

struct ControlThread {
    shared: Arc<DeviceShared>,
    pool: Arc<WorkerPool>,
    listener: UnixListener,
    stop: EventFd,
    notify: EventFd,
    events: Receiver<EventReport>,
    epoll: Epoll,
}

/// Why a connection ended.
enum Ended {
    Disconnected,
    Stop,
}

impl ControlThread {
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

    fn run(self) {
        if let Err(e) = self
            .watch(self.listener.as_raw_fd(), LISTEN_TOKEN)
            .and_then(|()| self.watch(self.stop.as_raw_fd(), STOP_TOKEN))
            .and_then(|()| self.watch(self.notify.as_raw_fd(), NOTIFY_TOKEN))
        {
            error!(device = self.shared.id, "epoll: {e}");
            return;
        }
        let mut events = [EpollEvent::default(); 8];
        loop {
            let n = match self.epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    error!(device = self.shared.id, "epoll_wait: {e}");
                    return;
                }
            };
            for ev in &events[..n] {
                match ev.data() {
                    STOP_TOKEN => return,
                    NOTIFY_TOKEN => {
                        // No driver connected: events are dropped.
                        let _ = self.notify.read();
                        while self.events.try_recv().is_ok() {}
                    }
                    LISTEN_TOKEN => match self.listener.accept() {
                        Ok((stream, _)) => {
                            // One frontend at a time: another one waits in
                            // the backlog until this one disconnects.
                            self.unwatch(self.listener.as_raw_fd());
                            if let Ended::Stop = self.serve(stream) {
                                return;
                            }
                            if let Err(e) = self.watch(self.listener.as_raw_fd(), LISTEN_TOKEN) {
                                error!(device = self.shared.id, "epoll: {e}");
                                return;
                            }
                        }
                        Err(e) => warn!(device = self.shared.id, "accept: {e}"),
                    },
                    _ => {}
                }
            }
        }
    }

    fn serve(&self, stream: UnixStream) -> Ended {
        let session = match Session::new(Arc::clone(&self.shared), Arc::clone(&self.pool)) {
            Ok(s) => Arc::new(Mutex::new(s)),
            Err(e) => {
                error!(device = self.shared.id, "cannot set up connection: {e}");
                return Ended::Disconnected;
            }
        };
        // Only this thread locks the session (BackendReqHandler needs the
        // Mutex); a poisoned lock would mean a panic on this thread.
        let (nexus, control_fd) = {
            let s = session.lock().unwrap_or_else(PoisonError::into_inner);
            (s.nexus, s.control.epoll_fd())
        };
        info!(
            device = self.shared.id,
            nexus = nexus.0,
            "frontend connected"
        );
        let mut handler = BackendReqHandler::from_stream(stream, Arc::clone(&session));
        let socket_fd = handler.as_raw_fd();
        if let Err(e) = self
            .watch(socket_fd, SOCKET_TOKEN)
            .and_then(|()| self.watch(control_fd, CONTROL_TOKEN))
        {
            error!(device = self.shared.id, "epoll: {e}");
            return Ended::Disconnected;
        }
        let ended = self.connection_loop(&mut handler, &session);
        self.unwatch(socket_fd);
        self.unwatch(control_fd);
        session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .teardown();
        ended
    }

    fn connection_loop(
        &self,
        handler: &mut BackendReqHandler<Mutex<Session>>,
        session: &Mutex<Session>,
    ) -> Ended {
        let mut events = [EpollEvent::default(); 8];
        let mut errors = 0u32;
        loop {
            let n = match self.epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    error!(device = self.shared.id, "epoll_wait: {e}");
                    return Ended::Stop;
                }
            };
            for ev in &events[..n] {
                match ev.data() {
                    STOP_TOKEN => return Ended::Stop,
                    SOCKET_TOKEN => match handler.handle_request() {
                        Ok(()) => errors = 0,
                        Err(
                            VhostError::Disconnected
                            | VhostError::PartialMessage
                            | VhostError::SocketBroken(_)
                            | VhostError::SocketError(_),
                        ) => return Ended::Disconnected,
                        Err(e) => {
                            errors += 1;
                            warn!(device = self.shared.id, "vhost-user request failed: {e}");
                            if errors >= MAX_CONSECUTIVE_ERRORS {
                                error!(
                                    device = self.shared.id,
                                    "too many failed requests: dropping the connection"
                                );
                                return Ended::Disconnected;
                            }
                        }
                    },
                    CONTROL_TOKEN => {
                        let mut s = session.lock().unwrap_or_else(PoisonError::into_inner);
                        let fired = s.control.fired();
                        for vq in [CONTROL_VQ, EVENT_VQ] {
                            if fired[vq] {
                                s.service_control(vq);
                            }
                        }
                    }
                    NOTIFY_TOKEN => {
                        let _ = self.notify.read();
                        let mut s = session.lock().unwrap_or_else(PoisonError::into_inner);
                        while let Ok(e) = self.events.try_recv() {
                            s.report_event(e.lun, e.event, e.reason);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}
