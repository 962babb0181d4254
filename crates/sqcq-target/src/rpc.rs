//! The management API: JSON-RPC 2.0 on the admin socket.
//!
//! One request per line, one response per line (newline-delimited JSON,
//! as SPDK's `rpc.py` and QMP speak in spirit); batches (a JSON array)
//! and notifications (no `id`: no response) as the JSON-RPC 2.0
//! specification defines them. `rpc.discover` answers an OpenRPC
//! document describing every method, built from the same table that
//! dispatches them ([`METHODS`]), so the description cannot drift from
//! the code. A line that is not JSON gets the parse error (-32700);
//! [`crate::admin`] serves the socket.
//!
//! Every change goes through the [`Registry`], like the configuration
//! file at start and at reload: `device_create` takes a `[[device]]`
//! table of the configuration file (as JSON, same keys), `lun_add` the
//! keys of a `[[device.lun]]` table.
//!
//! The JSON-RPC layer is our own: it is a few dozen lines over
//! `serde_json`, and the crates that implement JSON-RPC bring an async
//! runtime or an HTTP server this daemon has no use for.
//!
//! `sqcqd rpc [--admin-socket PATH] METHOD [key=value|key:=json]...`
//! ([`crate::client`], over [`call`]) is the client.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{Map, Value, json};
use vmm_sys_util::eventfd::EventFd;

use crate::config::{ConfigError, DaemonConfig, LunSpec, SaveError, device_from_json, parse_size};
use crate::registry::{Origin, Registry, RegistryError};
use crate::runtime::events::{self, Event, Subscription};
use crate::runtime::qos::QosLimits;
use crate::runtime::worker::PoolError;
use crate::scsi::hotplug::HotplugError;
use crate::scsi::target::TargetError;
use crate::transport::session::MoveError;

/// JSON-RPC 2.0: invalid JSON.
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC 2.0: not a request object.
pub const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC 2.0: no such method.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC 2.0: invalid parameters.
pub const INVALID_PARAMS: i64 = -32602;
/// JSON-RPC 2.0: internal error.
pub const INTERNAL_ERROR: i64 = -32603;
/// The change failed (I/O, a thread that did not answer, ...).
pub const FAILED: i64 = -32000;
/// The device, LUN, queue or worker named does not exist.
pub const NOT_FOUND: i64 = -32001;
/// Refused in the present state: the LUN exists, the socket is in use,
/// the worker serves queues, it is the last worker.
pub const CONFLICT: i64 = -32002;
/// Reloading needs the daemon to have been started from a file.
pub const NOT_SUPPORTED: i64 = -32003;

/// A JSON-RPC error object.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcError {
    /// The code (see the constants of this module).
    pub code: i64,
    /// What went wrong, on one line.
    pub message: String,
}

impl RpcError {
    fn params(message: impl Into<String>) -> Self {
        RpcError {
            code: INVALID_PARAMS,
            message: message.into(),
        }
    }
}

impl From<RegistryError> for RpcError {
    fn from(e: RegistryError) -> Self {
        let code = match &e {
            RegistryError::NoDevice(_)
            | RegistryError::NoQueue { .. }
            | RegistryError::Pool(PoolError::NoWorker(_))
            | RegistryError::Lun(HotplugError::NoSuchLun(_) | HotplugError::NotScsi(_)) => {
                NOT_FOUND
            }
            RegistryError::WorkerInUse { .. }
            | RegistryError::InUse { .. }
            | RegistryError::SocketInUse(..)
            | RegistryError::Full
            | RegistryError::Move(MoveError::Busy { .. })
            | RegistryError::Pool(PoolError::Busy { .. } | PoolError::Last(_) | PoolError::Full)
            | RegistryError::Lun(HotplugError::Exists(_)) => CONFLICT,
            RegistryError::Config(_)
            | RegistryError::SandboxedRbd
            | RegistryError::Pool(PoolError::BadCpu(_))
            | RegistryError::Lun(
                HotplugError::BadLun
                | HotplugError::BadSize { .. }
                // The LUN's parameters (a WWN that is not NAA type 5, a
                // block size the unit refuses, a missing field), not the
                // storage.
                | HotplugError::Build(
                    TargetError::Config { .. } | TargetError::Spec { .. } | TargetError::Duplicate(_),
                ),
            ) => INVALID_PARAMS,
            _ => FAILED,
        };
        RpcError {
            code,
            message: crate::runtime::error_chain(&e),
        }
    }
}

impl From<ConfigError> for RpcError {
    fn from(e: ConfigError) -> Self {
        RpcError::params(crate::runtime::error_chain(&e))
    }
}

/// Where `config_reload` (and SIGHUP) read the configuration from: the
/// command line and the file it names, read again.
pub type ConfigSource = Box<dyn Fn() -> Result<DaemonConfig, ConfigError> + Send>;

/// Where a reload the `config_reload` method runs is.
#[derive(Debug)]
pub enum ReloadPhase<'a> {
    /// It begins (the configuration is about to be read).
    Started,
    /// It ended: what it changed and what it could not, or why nothing.
    Done(&'a Result<crate::registry::ReloadReport, RpcError>),
}

/// Told when the `config_reload` method reloads (the daemon tells the
/// service manager, as for SIGHUP).
pub type ReloadHook = Box<dyn Fn(ReloadPhase<'_>) + Send>;

/// What the methods act on.
pub struct Context {
    /// The devices and workers.
    pub registry: Arc<Registry>,
    /// The configuration to reload (`None`: `config_reload` is refused).
    pub source: Mutex<Option<ConfigSource>>,
    /// Told when `config_reload` reloads.
    pub reload_hook: Mutex<Option<ReloadHook>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context over `registry`, without a configuration source.
    pub fn new(registry: Arc<Registry>) -> Self {
        Context {
            registry,
            source: Mutex::new(None),
            reload_hook: Mutex::new(None),
        }
    }

    /// [`Self::reload`], told to the reload hook: the `config_reload`
    /// method. Without a configuration source nothing is reloaded and
    /// nothing told.
    pub fn reload_announced(&self) -> Result<crate::registry::ReloadReport, RpcError> {
        let has_source = self
            .source
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        let hook = self
            .reload_hook
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let tell = |phase| {
            if let Some(h) = hook.as_ref().filter(|_| has_source) {
                h(phase);
            }
        };
        tell(ReloadPhase::Started);
        let result = self.reload();
        tell(ReloadPhase::Done(&result));
        result
    }

    /// Reads the configuration again and applies it (SIGHUP,
    /// `config_reload`).
    pub fn reload(&self) -> Result<crate::registry::ReloadReport, RpcError> {
        let source = self.source.lock().unwrap_or_else(PoisonError::into_inner);
        let read = source.as_ref().ok_or(RpcError {
            code: NOT_SUPPORTED,
            message: "the daemon was started without --config: nothing to reload".into(),
        })?;
        // The file could not be read or is invalid: not the caller's
        // parameters.
        let config = read().map_err(|e| RpcError {
            code: FAILED,
            message: crate::runtime::error_chain(&e),
        })?;
        Ok(self.registry.reload(&config))
    }
}

/// One parameter of a method, for `rpc.discover`.
#[derive(Debug)]
pub struct Param {
    /// Its name.
    pub name: &'static str,
    /// Its JSON schema type (`integer`, `string`, ...).
    pub schema: &'static str,
    /// Whether it must be given.
    pub required: bool,
    /// What it is.
    pub summary: &'static str,
}

/// A method of the API.
pub struct Method {
    /// Its name.
    pub name: &'static str,
    /// What it does.
    pub summary: &'static str,
    /// Its parameters (by name).
    pub params: &'static [Param],
    /// Whether it takes keys other than `params` (`device_create`,
    /// `lun_add`: the configuration file's keys).
    pub open: bool,
    handler: fn(&Call<'_>, &Map<String, Value>) -> Result<Value, RpcError>,
}

/// A request being answered: the daemon, and the admin socket connection
/// it came on (none for a caller within the process).
#[derive(Debug)]
pub struct Call<'a> {
    ctx: &'a Context,
    connection: Option<&'a Connection>,
}

impl std::ops::Deref for Call<'_> {
    type Target = Context;

    fn deref(&self) -> &Context {
        self.ctx
    }
}

/// What a connection of the admin socket keeps between its requests: its
/// subscription to events (`events_subscribe`).
#[derive(Debug)]
pub struct Connection {
    subscription: Mutex<Option<Arc<Subscription>>>,
    /// Written when events are queued for it.
    wake: Arc<EventFd>,
}

impl Connection {
    /// A connection without a subscription; `wake` is written when events
    /// are queued for it once it subscribed.
    pub fn new(wake: Arc<EventFd>) -> Self {
        Connection {
            subscription: Mutex::new(None),
            wake,
        }
    }

    /// Its subscription, if it subscribed.
    pub fn subscription(&self) -> Option<Arc<Subscription>> {
        self.subscription
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn subscribe(&self, sub: Option<Arc<Subscription>>) -> bool {
        let mut s = self
            .subscription
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        std::mem::replace(&mut *s, sub).is_some()
    }
}

/// The connection of a call, or why the method needs one.
fn connection<'a>(call: &Call<'a>, method: &str) -> Result<&'a Connection, RpcError> {
    call.connection.ok_or_else(|| RpcError {
        code: INVALID_REQUEST,
        message: format!("{method} is for a client of the admin socket, which it changes"),
    })
}

impl std::fmt::Debug for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Method").field("name", &self.name).finish()
    }
}

const fn p(
    name: &'static str,
    schema: &'static str,
    required: bool,
    summary: &'static str,
) -> Param {
    Param {
        name,
        schema,
        required,
        summary,
    }
}

const DEVICE: Param = p("device", "integer", true, "Device number (device_list)");
const FORCE: Param = p(
    "force",
    "boolean",
    false,
    "Go ahead while a frontend is connected: its VM loses the disk (default false)",
);

/// Every method, in the order `rpc.discover` lists them.
pub static METHODS: &[Method] = &[
    Method {
        name: "rpc.discover",
        summary: "This API as an OpenRPC document",
        params: &[],
        open: false,
        handler: |_, _| Ok(discover()),
    },
    Method {
        name: "daemon_info",
        summary: "Version, process id, numbers of devices and workers",
        params: &[],
        open: false,
        handler: |ctx, _| {
            Ok(json!({
                "version": env!("CARGO_PKG_VERSION"),
                "pid": std::process::id(),
                "devices": ctx.registry.ids().len(),
                "workers": ctx.registry.pool().len(),
            }))
        },
    },
    Method {
        name: "device_list",
        summary: "Every device: type, socket, connection, LUNs, request queues and their workers",
        params: &[],
        open: false,
        handler: |ctx, _| to_value(&ctx.registry.list()),
    },
    Method {
        name: "device_create",
        summary: "Create a device and listen on its socket; params: the keys of a [[device]] table \
                  of the configuration file (type, socket-path, lun, num-queues, queue-size, \
                  queue-map); a lun is a table or a --lun string",
        params: &[
            p(
                "socket-path",
                "string",
                true,
                "vhost-user socket to listen on",
            ),
            p("type", "string", false, "scsi (default) or blk"),
            p(
                "lun",
                "array",
                false,
                "LUNs (scsi) or the one disk (blk): objects with the keys of --lun, or --lun strings",
            ),
            p("num-queues", "integer", false, "Request queues (default 1)"),
            p(
                "queue-size",
                "integer",
                false,
                "Largest vring size (default 1024)",
            ),
            p("queue-map", "string", false, "QUEUE:WORKER[,...]"),
        ],
        open: true,
        handler: |ctx, params| {
            let config = device_from_json(Value::Object(params.clone()))?;
            let id = ctx.registry.create(config, Origin::Api)?;
            Ok(json!({ "device": id }))
        },
    },
    Method {
        name: "device_delete",
        summary: "Stop a device after its requests in flight, disconnect its frontend, remove its \
                  socket; refused while a frontend is connected unless force",
        params: &[DEVICE, FORCE],
        open: false,
        handler: |ctx, params| {
            let force = bool_param(params, "force")?;
            ctx.registry.delete(u32_param(params, "device")?, force)?;
            Ok(Value::Null)
        },
    },
    Method {
        name: "lun_add",
        summary: "Add a LUN to a SCSI device (the guest is told: REPORTED LUNS DATA HAS CHANGED and \
                  a rescan event); params: device plus the keys of --lun",
        params: &[
            DEVICE,
            p("lun", "integer", true, "LUN number"),
            p("kind", "string", true, "null, ram, file or rbd"),
            p("size", "string", false, "Bytes (K, M, G, T suffixes)"),
            p("path", "string", false, "Backing file or block device"),
            p(
                "create",
                "boolean",
                false,
                "Create a missing file of size bytes",
            ),
            p("block-size", "integer", false, "512 (default) or 4096"),
            p("read-only", "boolean", false, "Refuse writes"),
            p("serial", "string", false, "Unit serial number (VPD 0x80)"),
            p("wwn", "string", false, "NAA WWN 0x5... (VPD 0x83)"),
            p("zero", "boolean", false, "Null LUNs: reads return zeros"),
            p(
                "lock",
                "boolean",
                false,
                "File LUNs: lock the image as QEMU does (default true)",
            ),
            p("pool", "string", false, "RBD: the pool"),
            p("image", "string", false, "RBD: the image"),
            p("namespace", "string", false, "RBD: the pool namespace"),
            p(
                "snap",
                "string",
                false,
                "RBD: serve this snapshot, read-only",
            ),
            p("conf", "string", false, "RBD: the Ceph configuration file"),
            p(
                "id",
                "string",
                false,
                "RBD: the cephx user, without client.",
            ),
            p("keyring", "string", false, "RBD: the keyring"),
        ],
        open: true,
        handler: |ctx, params| {
            let device = u32_param(params, "device")?;
            let mut spec = params.clone();
            spec.remove("device");
            let spec: LunSpec = serde_json::from_value(Value::Object(spec))
                .map_err(|e| RpcError::params(e.to_string()))?;
            if spec.lun.is_none() {
                return Err(RpcError::params("lun is required"));
            }
            let lun = ctx.registry.lun_add(device, &spec)?;
            Ok(json!({ "lun": lun }))
        },
    },
    Method {
        name: "lun_remove",
        summary: "Remove a LUN once its requests in flight completed (the guest is told); \
                  refused while a frontend is connected unless force",
        params: &[DEVICE, p("lun", "integer", true, "LUN number"), FORCE],
        open: false,
        handler: |ctx, params| {
            let device = u32_param(params, "device")?;
            let force = bool_param(params, "force")?;
            ctx.registry
                .lun_remove(device, u16_param(params, "lun")?, force)?;
            Ok(Value::Null)
        },
    },
    Method {
        name: "lun_resize",
        summary: "Change the capacity of a LUN (a blk device's disk is LUN 0)",
        params: &[
            DEVICE,
            p("lun", "integer", true, "LUN number"),
            p(
                "size",
                "string",
                true,
                "New size in bytes (K, M, G, T suffixes)",
            ),
        ],
        open: false,
        handler: |ctx, params| {
            let device = u32_param(params, "device")?;
            let lun = u16_param(params, "lun")?;
            let bytes = size_param(params, "size")?;
            let blocks = ctx.registry.lun_resize(device, lun, bytes)?;
            Ok(json!({ "blocks": blocks }))
        },
    },
    Method {
        name: "worker_create",
        summary: "Start a worker thread (VHOST_NEW_WORKER); answers its number",
        params: &[p("cpu", "integer", false, "CPU to bind it to")],
        open: false,
        handler: |ctx, params| {
            let cpu = opt_usize(params, "cpu")?;
            Ok(json!({ "worker": ctx.registry.worker_create(cpu)? }))
        },
    },
    Method {
        name: "worker_free",
        summary: "End a worker (VHOST_FREE_WORKER): refused while a queue is attached to it or runs on it",
        params: &[p("worker", "integer", true, "Worker number")],
        open: false,
        handler: |ctx, params| {
            let w = opt_usize(params, "worker")?
                .ok_or_else(|| RpcError::params("worker is required"))?;
            ctx.registry.worker_free(w)?;
            Ok(Value::Null)
        },
    },
    Method {
        name: "worker_list",
        summary: "Every worker: number, CPU, the queues it serves",
        params: &[],
        open: false,
        handler: |ctx, _| to_value(&ctx.registry.workers()),
    },
    Method {
        name: "queue_attach_worker",
        summary: "Attach a request queue to a worker (VHOST_ATTACH_VRING_WORKER); a running queue \
                  moves at once, without losing a request",
        params: &[
            DEVICE,
            p(
                "rq",
                "integer",
                true,
                "Request queue (0: the first request virtqueue)",
            ),
            p(
                "worker",
                "integer",
                true,
                "Worker number, or null for round robin",
            ),
        ],
        open: false,
        handler: |ctx, params| {
            let device = u32_param(params, "device")?;
            let rq = u16_param(params, "rq")?;
            let worker = match params.get("worker") {
                Some(Value::Null) => None,
                _ => Some(
                    opt_usize(params, "worker")?
                        .ok_or_else(|| RpcError::params("worker is required"))?,
                ),
            };
            let moved = ctx.registry.attach(device, rq, worker)?;
            Ok(json!({
                "moved": moved.map(|(vq, from, to)| json!({ "vq": vq, "from": from, "to": to })),
            }))
        },
    },
    Method {
        name: "device_set_qos",
        summary: "Limit a device's IOPS and bandwidth from now on, every queue together (a \
                  request over the limit waits on the ring), or with lun one LUN of a SCSI \
                  device (its requests wait in the queue, the other LUNs' go on); without iops \
                  and bps, no limit",
        params: &[
            DEVICE,
            p(
                "lun",
                "integer",
                false,
                "Only this LUN of a SCSI device (a blk device's disk is the device)",
            ),
            p(
                "iops",
                "integer",
                false,
                "Requests per second (0 or absent: no limit)",
            ),
            p(
                "bps",
                "integer",
                false,
                "Bytes per second (0 or absent: no limit)",
            ),
            p(
                "burst_ms",
                "integer",
                false,
                "How far ahead of the limit a burst may go, in ms of it (default 100)",
            ),
        ],
        open: false,
        handler: |ctx, params| {
            let device = u32_param(params, "device")?;
            let lun = match params.get("lun") {
                None | Some(Value::Null) => None,
                Some(_) => Some(u16_param(params, "lun")?),
            };
            let limits = QosLimits {
                iops: opt_u64(params, "iops")?,
                bps: opt_u64(params, "bps")?,
                burst_ms: opt_u64(params, "burst_ms")?,
            };
            to_value(&ctx.registry.set_qos(device, lun, limits)?)
        },
    },
    Method {
        name: "device_quiesce",
        summary: "Drain a device: its queues take no new request (they wait on the rings, the \
                  guest sees time) and this answers once the requests in flight completed, or \
                  after timeout_ms with how many are left; the device stays quiesced until \
                  device_resume (e.g. while its backing file is copied or snapshotted)",
        params: &[
            DEVICE,
            p(
                "timeout_ms",
                "integer",
                false,
                "How long to wait for the requests in flight (default 30000)",
            ),
        ],
        open: false,
        handler: |ctx, params| {
            let device = u32_param(params, "device")?;
            let ms = opt_u64(params, "timeout_ms")?.unwrap_or(30_000);
            let left = ctx.registry.quiesce(device, Duration::from_millis(ms))?;
            if left > 0 {
                return Err(RpcError {
                    code: FAILED,
                    message: format!(
                        "device {device}: {left} requests still in flight after {ms} ms (a \
                         backstore that does not answer); it stays quiesced: device_resume \
                         to go on, or device_quiesce again to wait longer"
                    ),
                });
            }
            Ok(json!({ "in_flight": 0 }))
        },
    },
    Method {
        name: "device_resume",
        summary: "Let a quiesced device take requests again",
        params: &[DEVICE],
        open: false,
        handler: |ctx, params| {
            let was = ctx.registry.resume(u32_param(params, "device")?)?;
            Ok(json!({ "was_quiesced": was }))
        },
    },
    Method {
        name: "stats_get",
        summary: "Figures of every queue that ran (or of one device): completions, kicks, calls, \
                  spins, sleeps, mode; each device's error counters; each LUN's operations, \
                  bytes, errors and service time by kind (read, write, flush, discard, \
                  write_zeroes)",
        params: &[p("device", "integer", false, "Only this device")],
        open: false,
        handler: |ctx, params| {
            let only = match params.get("device") {
                None | Some(Value::Null) => None,
                Some(_) => Some(u32_param(params, "device")?),
            };
            let queues: Vec<_> = ctx
                .registry
                .stats()
                .into_iter()
                .filter(|q| only.is_none_or(|d| d == q.device))
                .collect();
            let (mut errors, mut events, mut luns) = (Map::new(), Map::new(), Map::new());
            let object = |pairs: &[(&str, u64)]| {
                Value::Object(
                    pairs
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), json!(v)))
                        .collect(),
                )
            };
            for id in ctx
                .registry
                .ids()
                .into_iter()
                .filter(|d| only.is_none_or(|o| o == *d))
            {
                if let Some(shared) = ctx.registry.shared(id) {
                    let m = &shared.info.metrics;
                    errors.insert(id.to_string(), object(&m.errors()));
                    events.insert(id.to_string(), object(&m.events()));
                }
                if let Ok(control) = ctx.registry.control(id) {
                    let io: Map<String, Value> = (control.lun_io().into_iter())
                        .map(|(lun, io)| Ok((lun.to_string(), to_value(&io)?)))
                        .collect::<Result<_, RpcError>>()?;
                    luns.insert(id.to_string(), Value::Object(io));
                }
            }
            if let Some(d) = only.filter(|d| !errors.contains_key(&d.to_string())) {
                return Err(RegistryError::NoDevice(d).into());
            }
            Ok(json!({
                "queues": to_value(&queues)?,
                "errors": errors,
                "events": events,
                "luns": luns,
            }))
        },
    },
    Method {
        name: "config_save",
        summary: "Write the running daemon (options, workers, devices, LUNs, queue maps) as a \
                  TOML file that `sqcqd --config FILE` or a reload turns back into it; answers \
                  what the file cannot say (notes)",
        params: &[p(
            "path",
            "string",
            false,
            "Absolute path of the file, replaced atomically (default: --save-config's)",
        )],
        open: false,
        handler: |ctx, params| {
            let path = match params.get("path") {
                None | Some(Value::Null) => ctx.registry.autosave_path().ok_or_else(|| {
                    RpcError::params("path is required (the daemon has no --save-config file)")
                })?,
                Some(Value::String(s)) => PathBuf::from(s),
                Some(_) => return Err(RpcError::params("path must be a string")),
            };
            let notes = ctx.registry.save(&path).map_err(|e| RpcError {
                code: match e {
                    SaveError::Relative(_) => INVALID_PARAMS,
                    _ => FAILED,
                },
                message: crate::runtime::error_chain(&e),
            })?;
            Ok(json!({ "path": path, "notes": notes }))
        },
    },
    Method {
        name: "events_subscribe",
        summary: "Send this connection a JSON-RPC notification (method \"event\") for each \
                  event from now on: frontend_connected, frontend_disconnected, queue_started, \
                  queue_stopped, queue_broken, io_error, device_created, device_deleted, \
                  lun_added, lun_removed, lun_resized, reload_done (docs/target.md, Events)",
        params: &[p(
            "events",
            "array",
            false,
            "Only these events (default: every one)",
        )],
        open: false,
        handler: |call, params| {
            let conn = connection(call, "events_subscribe")?;
            let only = match params.get("events") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(names)) => names
                    .iter()
                    .map(|n| match n.as_str() {
                        Some(s) if Event::NAMES.contains(&s) => Ok(s.to_owned()),
                        _ => Err(RpcError::params(format!(
                            "no event {n}: the events are {}",
                            Event::NAMES.join(", ")
                        ))),
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(RpcError::params("events must be an array of names")),
            };
            let names: Vec<&str> = if only.is_empty() {
                Event::NAMES.to_vec()
            } else {
                only.iter().map(String::as_str).collect()
            };
            let result = json!({ "events": names, "queue": events::QUEUE_LEN });
            conn.subscribe(Some(call.registry.events().subscribe(&only, &conn.wake)));
            Ok(result)
        },
    },
    Method {
        name: "events_unsubscribe",
        summary: "Send this connection no more events",
        params: &[],
        open: false,
        handler: |call, _| {
            let was = connection(call, "events_unsubscribe")?.subscribe(None);
            Ok(json!({ "was_subscribed": was }))
        },
    },
    Method {
        name: "config_reload",
        summary: "Read the configuration file again and apply what changed (what SIGHUP does)",
        params: &[],
        open: false,
        handler: |ctx, _| to_value(&ctx.reload_announced()?),
    },
];

/// Fault injection: only in builds with the `fault-injection` feature,
/// which the tests and CI turn on and release builds leave off.
#[cfg(feature = "fault-injection")]
static FAULT_METHODS: &[Method] = &[Method {
    name: "fault_break",
    summary: "Fault injection: the request queue vq (every running one without vq) breaks at \
                  its next request, as for a nonsense doorbell",
    params: &[DEVICE, p("vq", "integer", false, "Virtqueue index")],
    open: false,
    handler: |ctx, params| {
        let device = u32_param(params, "device")?;
        let vq = match params.get("vq") {
            None | Some(Value::Null) => None,
            Some(_) => Some(u16_param(params, "vq")?),
        };
        let armed = ctx.registry.control(device)?.break_queues(vq);
        if armed.is_empty() {
            return Err(RpcError {
                code: NOT_FOUND,
                message: HotplugError::NoQueue.to_string(),
            });
        }
        Ok(json!({ "armed": armed }))
    },
}];
#[cfg(not(feature = "fault-injection"))]
static FAULT_METHODS: &[Method] = &[];

/// Every method of the API: [`METHODS`], and fault injection in builds
/// that have it.
pub fn methods() -> impl Iterator<Item = &'static Method> {
    METHODS.iter().chain(FAULT_METHODS)
}

fn to_value<T: serde::Serialize>(v: &T) -> Result<Value, RpcError> {
    serde_json::to_value(v).map_err(|e| RpcError {
        code: INTERNAL_ERROR,
        message: e.to_string(),
    })
}

fn opt_usize(params: &Map<String, Value>, key: &str) -> Result<Option<usize>, RpcError> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| RpcError::params(format!("{key} must be a non-negative integer"))),
    }
}

fn opt_u64(params: &Map<String, Value>, key: &str) -> Result<Option<u64>, RpcError> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| RpcError::params(format!("{key} must be a non-negative integer"))),
    }
}

fn bool_param(params: &Map<String, Value>, key: &str) -> Result<bool, RpcError> {
    match params.get(key) {
        None => Ok(false),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| RpcError::params(format!("{key} must be true or false"))),
    }
}

fn u32_param(params: &Map<String, Value>, key: &str) -> Result<u32, RpcError> {
    opt_usize(params, key)?
        .ok_or_else(|| RpcError::params(format!("{key} is required")))
        .and_then(|n| u32::try_from(n).map_err(|_| RpcError::params(format!("{key} is too large"))))
}

fn u16_param(params: &Map<String, Value>, key: &str) -> Result<u16, RpcError> {
    u32_param(params, key)
        .and_then(|n| u16::try_from(n).map_err(|_| RpcError::params(format!("{key} is too large"))))
}

fn size_param(params: &Map<String, Value>, key: &str) -> Result<u64, RpcError> {
    match params.get(key) {
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| RpcError::params(format!("{key} must be a non-negative integer"))),
        Some(Value::String(s)) => parse_size(s).map_err(RpcError::params),
        _ => Err(RpcError::params(format!("{key} is required"))),
    }
}

/// The OpenRPC document of [`methods`].
pub fn discover() -> Value {
    let methods: Vec<Value> = methods()
        .map(|m| {
            let params: Vec<Value> = m
                .params
                .iter()
                .map(|p| {
                    json!({
                        "name": p.name,
                        "summary": p.summary,
                        "required": p.required,
                        "schema": { "type": p.schema },
                    })
                })
                .collect();
            json!({
                "name": m.name,
                "summary": m.summary,
                "paramStructure": "by-name",
                "params": params,
                "x-additional-params": m.open,
                "result": { "name": "result", "schema": {} },
            })
        })
        .collect();
    json!({
        "openrpc": "1.2.6",
        "info": {
            "title": "sqcqd management API",
            "version": env!("CARGO_PKG_VERSION"),
        },
        "methods": methods,
    })
}

fn error_response(id: Value, e: &RpcError) -> Value {
    json!({
        "jsonrpc": "2.0",
        "error": { "code": e.code, "message": e.message },
        "id": id,
    })
}

/// Answers one request object; `None` for a notification.
fn request(call: &Call<'_>, req: &Value) -> Option<Value> {
    let Some(obj) = req.as_object() else {
        return Some(error_response(
            Value::Null,
            &RpcError {
                code: INVALID_REQUEST,
                message: "a request is an object".into(),
            },
        ));
    };
    // An id, if any, must be a string, a number or null.
    let id = obj.get("id").cloned();
    let valid_id = id
        .as_ref()
        .is_none_or(|i| i.is_string() || i.is_number() || i.is_null());
    let reply_id = id.clone().filter(|_| valid_id).unwrap_or(Value::Null);
    let invalid = |message: &str| {
        Some(error_response(
            reply_id.clone(),
            &RpcError {
                code: INVALID_REQUEST,
                message: message.into(),
            },
        ))
    };
    if obj.get("jsonrpc") != Some(&json!("2.0")) {
        return invalid("jsonrpc must be \"2.0\"");
    }
    if !valid_id {
        return invalid("id must be a string, a number or null");
    }
    let Some(name) = obj.get("method").and_then(Value::as_str) else {
        return invalid("method must be a string");
    };
    let empty = Map::new();
    let params = match obj.get("params") {
        None => &empty,
        Some(Value::Object(m)) => m,
        // A notification is never answered, not even with an error.
        Some(_) => {
            return id.map(|_| {
                error_response(
                    reply_id,
                    &RpcError::params("params must be an object (by name)"),
                )
            });
        }
    };
    let result = match methods().find(|m| m.name == name) {
        None => Err(RpcError {
            code: METHOD_NOT_FOUND,
            message: format!("no method {name:?} (rpc.discover lists them)"),
        }),
        Some(m) => check_params(m, params).and_then(|()| (m.handler)(call, params)),
    };
    match &result {
        // Changes are logged where they are made; reads only when asked.
        Ok(_) => tracing::debug!(method = name, "rpc"),
        Err(e) => tracing::warn!(method = name, code = e.code, "rpc: {}", e.message),
    }
    let id = id?;
    Some(match result {
        Ok(v) => json!({ "jsonrpc": "2.0", "result": v, "id": id }),
        Err(e) => error_response(id, &e),
    })
}

/// A method with a closed parameter list refuses a key it does not know.
fn check_params(m: &Method, params: &Map<String, Value>) -> Result<(), RpcError> {
    if m.open {
        return Ok(());
    }
    match params
        .keys()
        .find(|k| !m.params.iter().any(|p| p.name == k.as_str()))
    {
        Some(k) => Err(RpcError::params(format!(
            "{} takes no parameter {k:?}",
            m.name
        ))),
        None => Ok(()),
    }
}

/// Answers one line of the admin socket (a request or a batch; anything
/// else gets an error response); `None` when nothing is to be sent back.
pub fn handle_line(ctx: &Context, line: &str) -> Option<String> {
    handle(
        &Call {
            ctx,
            connection: None,
        },
        line,
    )
}

/// [`handle_line`] for a line that came on the admin socket connection
/// `connection`.
pub fn handle_line_on(ctx: &Context, connection: &Connection, line: &str) -> Option<String> {
    handle(
        &Call {
            ctx,
            connection: Some(connection),
        },
        line,
    )
}

fn handle(call: &Call<'_>, line: &str) -> Option<String> {
    let parsed: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => {
            let e = RpcError {
                code: PARSE_ERROR,
                message: e.to_string(),
            };
            return Some(error_response(Value::Null, &e).to_string());
        }
    };
    let reply = match parsed {
        Value::Array(batch) if batch.is_empty() => Some(error_response(
            Value::Null,
            &RpcError {
                code: INVALID_REQUEST,
                message: "empty batch".into(),
            },
        )),
        Value::Array(batch) => {
            let replies: Vec<Value> = batch.iter().filter_map(|r| request(call, r)).collect();
            (!replies.is_empty()).then_some(Value::Array(replies))
        }
        req => request(call, &req),
    };
    reply.map(|v| v.to_string())
}

/// The reply to a line longer than `max` bytes, which is not read: an
/// invalid request, as the request it holds is never parsed.
pub fn line_too_long(max: usize) -> String {
    let e = RpcError {
        code: INVALID_REQUEST,
        message: format!("a request line is at most {max} bytes"),
    };
    error_response(Value::Null, &e).to_string()
}

/// The reply to a line that could not be run (no thread for it): an
/// internal error, for a request whose id was not read.
pub fn internal_error(e: &std::io::Error) -> String {
    let e = RpcError {
        code: INTERNAL_ERROR,
        message: format!("cannot run the request: {e}"),
    };
    error_response(Value::Null, &e).to_string()
}

/// The errors a `config_reload` result reports, if it reports any: the
/// reload failed in part, though the call itself succeeded.
pub fn reload_errors<'a>(method: &str, result: &'a Value) -> Option<&'a [Value]> {
    if method != "config_reload" {
        return None;
    }
    result
        .get("errors")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .filter(|e| !e.is_empty())
}

/// How long the client waits for an answer (a removal waits for I/O).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

/// The client: calls `method` with `params` on the admin socket at
/// `path`; `Ok(Ok(result))`, or the error object the daemon answered.
pub fn call(
    path: &Path,
    method: &str,
    params: Map<String, Value>,
) -> io::Result<Result<Value, Value>> {
    let req = json!({ "jsonrpc": "2.0", "method": method, "params": params, "id": 1 });
    outcome(exchange(path, &req, CLIENT_TIMEOUT)?)
}

/// Calls every `(method, params)` of `calls` in one batch, one line on
/// one connection (so the answers describe one moment, in one round
/// trip), waiting at most `timeout` for the answer: each call's result or
/// error object, in the order of `calls`.
pub fn call_batch(
    path: &Path,
    calls: &[(&str, Map<String, Value>)],
    timeout: Duration,
) -> io::Result<Vec<Result<Value, Value>>> {
    let batch: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(id, (method, params))| {
            json!({ "jsonrpc": "2.0", "method": method, "params": params, "id": id })
        })
        .collect();
    let Value::Array(replies) = exchange(path, &Value::Array(batch), timeout)? else {
        return Err(io::Error::other("not a JSON-RPC batch response"));
    };
    // The answers of a batch may come in any order: placed by id.
    let mut out: Vec<Option<Result<Value, Value>>> = calls.iter().map(|_| None).collect();
    for reply in replies {
        let slot = reply
            .get("id")
            .and_then(Value::as_u64)
            .and_then(|id| usize::try_from(id).ok())
            .and_then(|id| out.get_mut(id))
            .ok_or_else(|| io::Error::other(format!("an answer to no call: {reply}")))?;
        *slot = Some(outcome(reply)?);
    }
    out.into_iter()
        .zip(calls)
        .map(|(r, (method, _))| {
            r.ok_or_else(|| io::Error::other(format!("{method} was not answered")))
        })
        .collect()
}

/// Sends `request` (an object or a batch) on a new connection to `path`
/// and reads the one line that answers it.
fn exchange(path: &Path, request: &Value, timeout: Duration) -> io::Result<Value> {
    let mut conn = UnixStream::connect(path)?;
    conn.set_read_timeout(Some(timeout))?;
    let mut line = request.to_string();
    line.push('\n');
    conn.write_all(line.as_bytes())?;
    let mut reply = String::new();
    BufReader::new(&conn).read_line(&mut reply)?;
    if reply.is_empty() {
        return Err(io::Error::other(
            "the daemon closed the connection without an answer",
        ));
    }
    serde_json::from_str(&reply).map_err(io::Error::other)
}

/// A response object as `Ok(result)` or `Err(error object)`.
fn outcome(mut v: Value) -> io::Result<Result<Value, Value>> {
    match (v.get_mut("result").map(Value::take), v.get_mut("error")) {
        (Some(r), _) => Ok(Ok(r)),
        (None, Some(e)) => Ok(Err(e.take())),
        _ => Err(io::Error::other(format!("not a JSON-RPC response: {v}"))),
    }
}

/// Subscribes to the events named in `only` (every one if empty) on the
/// admin socket `path` and hands each notification's parameters to `each`
/// until it returns false. `Ok(Err(error))`: the daemon refused the
/// subscription; `Err`: the socket failed, or the daemon closed it.
pub fn follow_events(
    path: &Path,
    only: &[String],
    mut each: impl FnMut(Value) -> bool,
) -> io::Result<Result<(), Value>> {
    let mut conn = UnixStream::connect(path)?;
    conn.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    let params = if only.is_empty() {
        json!({})
    } else {
        json!({ "events": only })
    };
    let req = json!({ "jsonrpc": "2.0", "method": "events_subscribe", "params": params, "id": 1 });
    conn.write_all(format!("{req}\n").as_bytes())?;
    let mut lines = BufReader::new(&conn);
    let mut line = String::new();
    let mut subscribed = false;
    loop {
        line.clear();
        if lines.read_line(&mut line)? == 0 {
            return Err(io::Error::other("the daemon closed the connection"));
        }
        let mut v: Value = serde_json::from_str(&line).map_err(io::Error::other)?;
        if !subscribed {
            if let Some(e) = v.get_mut("error") {
                return Ok(Err(e.take()));
            }
            subscribed = true;
            // Events may be far apart.
            conn.set_read_timeout(None)?;
            continue;
        }
        if v["method"] == events::METHOD && !each(v["params"].take()) {
            return Ok(Ok(()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscribing_needs_a_connection_of_the_admin_socket() {
        let options = crate::config::PollOptions {
            stats_interval: None,
            ..Default::default()
        };
        let pool = Arc::new(crate::runtime::worker::WorkerPool::new(1, options).unwrap());
        let ctx = Context::new(Arc::new(Registry::new(pool)));
        let line = r#"{"jsonrpc":"2.0","method":"events_subscribe","id":1}"#;
        let reply: Value = serde_json::from_str(&handle_line(&ctx, line).unwrap()).unwrap();
        assert_eq!(reply["error"]["code"], INVALID_REQUEST, "{reply}");
        let conn = Connection::new(Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()));
        let reply: Value =
            serde_json::from_str(&handle_line_on(&ctx, &conn, line).unwrap()).unwrap();
        assert_eq!(
            reply["result"]["events"].as_array().unwrap().len(),
            Event::NAMES.len()
        );
        let sub = conn.subscription().expect("subscribed");
        ctx.registry
            .events()
            .publish(Event::DeviceDeleted { device: 7 });
        let mut out = Vec::new();
        assert!(
            sub.take(&mut out),
            "the connection's subscription gets the event"
        );
        let unsub = r#"{"jsonrpc":"2.0","method":"events_unsubscribe","id":2}"#;
        let reply: Value =
            serde_json::from_str(&handle_line_on(&ctx, &conn, unsub).unwrap()).unwrap();
        assert_eq!(reply["result"]["was_subscribed"], true);
        assert!(conn.subscription().is_none());
    }

    #[test]
    fn every_method_is_described_once() {
        let doc = discover();
        let names: Vec<&str> = doc["methods"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap())
            .collect();
        assert_eq!(names.len(), methods().count());
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
        assert!(names.contains(&"queue_attach_worker"));
    }

    #[test]
    fn a_reload_that_reports_errors_failed() {
        let failed = json!({ "changed": ["worker 1 created"], "errors": ["lun_add: exists"] });
        assert_eq!(
            reload_errors("config_reload", &failed),
            Some(&[json!("lun_add: exists")][..])
        );
        let done = json!({ "changed": [], "errors": [] });
        assert_eq!(reload_errors("config_reload", &done), None);
        // stats_get's "errors" are counters, not a failure.
        let stats = json!({ "errors": { "0": { "bad_descriptor": 0 } } });
        assert_eq!(reload_errors("stats_get", &stats), None);
    }

    #[test]
    fn a_batch_is_answered_call_by_call_whatever_the_order() {
        let path = std::env::temp_dir().join(format!("sqcq-rpc-batch-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&conn).read_line(&mut line).unwrap();
            let batch: Vec<Value> = serde_json::from_str(&line).unwrap();
            // The second call first, and with an error.
            let answer = json!([
                { "jsonrpc": "2.0", "error": { "code": NOT_FOUND }, "id": batch[1]["id"] },
                { "jsonrpc": "2.0", "result": batch[0]["method"], "id": batch[0]["id"] },
            ]);
            (&conn).write_all(format!("{answer}\n").as_bytes()).unwrap();
        });
        let calls = [("daemon_info", Map::new()), ("stats_get", Map::new())];
        let answers = call_batch(&path, &calls, Duration::from_secs(10)).unwrap();
        server.join().unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            answers,
            [Ok(json!("daemon_info")), Err(json!({ "code": NOT_FOUND }))]
        );
    }

    #[test]
    fn registry_errors_map_to_codes() {
        assert_eq!(RpcError::from(RegistryError::NoDevice(3)).code, NOT_FOUND);
        assert_eq!(
            RpcError::from(RegistryError::Pool(PoolError::Last(0))).code,
            CONFLICT
        );
        assert_eq!(
            RpcError::from(RegistryError::Lun(HotplugError::BadLun)).code,
            INVALID_PARAMS
        );
    }
}
