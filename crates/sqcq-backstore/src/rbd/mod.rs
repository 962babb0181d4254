//! The RBD backstore: a Ceph RBD image through librbd, so that a disk
//! outlives the machine that serves it.
//!
//! Each backstore holds its own cluster connection (`rados_t`, as QEMU's
//! `rbd` driver does per drive), an I/O context on the pool (and
//! namespace), and the open image; each worker's queue submits through
//! librbd's asynchronous calls on that one image. Completions come back on
//! librbd's threads and reach the worker through the queue's completion
//! list and eventfd (see [`queue`]); no request waits in the worker.
//!
//! Fencing: a writable image's exclusive lock (librbd's `exclusive-lock`
//! feature, on by default in new images) is taken at open with
//! `rbd_lock_acquire` in librbd's manual mode, so a second writer (another
//! `sqcqd`, QEMU) is refused instead of the lock moving back and forth
//! between them; a lock left by a dead client is broken by librbd, which
//! blocklists that client first, once the cluster has noticed its death,
//! or at once by us when that client was a `sqcqd` of this host known to
//! be dead (see [`owner`]).
//! A live migration hands it over through [`Backstore::set_active`].
//!
//! Bindings: our own (`ffi`), since the published crates are unmaintained
//! or do not cover librbd; see that module.
//!
//! Cache: librbd's cache is turned off (`rbd_cache=false`, whatever the
//! configuration says), so that nothing acknowledged lives only in this
//! process; FUA writes are still followed by a flush, in case an image-
//! or pool-level setting turns the cache on again at open.
//!
//! Time-outs: a dead OSD or monitor must not hold a worker or the control
//! thread forever. Where the configuration leaves Ceph's defaults
//! (`rados_osd_op_timeout` and `rados_mon_op_timeout` 0, meaning never,
//! `client_mount_timeout` 300 s), [`RbdBackstore::open`] sets each to
//! [`DEFAULT_TIMEOUT_SECS`]; a value the operator set is kept.

mod ffi;
mod owner;
mod queue;

use std::ffi::{CString, c_char, c_int};
use std::io;
use std::path::PathBuf;
use std::ptr;
use std::sync::{Arc, Mutex, PoisonError};

use crate::capacity::Capacity;
use crate::{Backstore, BackstoreError, BackstoreQueue, Geometry, SizeWatcher};

/// Seconds given to OSD and monitor operations, and to the connection,
/// when the Ceph configuration does not say.
pub const DEFAULT_TIMEOUT_SECS: u32 = 30;

/// How to open an RBD backstore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdOptions {
    /// The pool that holds the image.
    pub pool: String,
    /// The image.
    pub image: String,
    /// The pool namespace (`None`: the default one).
    pub namespace: Option<String>,
    /// Serve this snapshot of the image, read-only.
    pub snap: Option<String>,
    /// The Ceph configuration file (`None`: librados' search: `$CEPH_CONF`,
    /// `/etc/ceph/ceph.conf`, `~/.ceph/config`, `./ceph.conf`).
    pub conf: Option<PathBuf>,
    /// The cephx user without `client.` (`None`: `admin`).
    pub id: Option<String>,
    /// The keyring (`None`: the configuration's `keyring`).
    pub keyring: Option<PathBuf>,
    /// Logical block size exposed to the initiator (512 or 4096).
    pub block_size: u32,
    /// Open read-only and refuse writes (always so with `snap`).
    pub read_only: bool,
    /// Take the image's exclusive lock at the first
    /// [`Backstore::set_active`] rather than at open: the destination of
    /// a live migration, whose source holds it until its device stops.
    pub defer_lock: bool,
}

impl RbdOptions {
    /// Options for `pool/image` with 512-byte blocks, read-write.
    pub fn new(pool: impl Into<String>, image: impl Into<String>) -> Self {
        RbdOptions {
            pool: pool.into(),
            image: image.into(),
            namespace: None,
            snap: None,
            conf: None,
            id: None,
            keyring: None,
            block_size: 512,
            read_only: false,
            defer_lock: false,
        }
    }

    /// `pool/[namespace/]image[@snap]`, as `rbd` spells it.
    pub fn spec(&self) -> String {
        let mut s = self.pool.clone();
        if let Some(ns) = &self.namespace {
            s.push('/');
            s.push_str(ns);
        }
        s.push('/');
        s.push_str(&self.image);
        if let Some(snap) = &self.snap {
            s.push('@');
            s.push_str(snap);
        }
        s
    }
}

/// The error of a librados or librbd call that returned `rc` (`-errno`).
fn ceph_error(what: String, rc: c_int) -> BackstoreError {
    BackstoreError::Ceph {
        what,
        source: io::Error::from_raw_os_error(rc.saturating_neg()),
    }
}

fn cstring(what: &str, s: &str) -> Result<CString, BackstoreError> {
    CString::new(s).map_err(|_| BackstoreError::Ceph {
        what: format!("{what} contains a NUL byte"),
        source: io::Error::from(io::ErrorKind::InvalidInput),
    })
}

fn path_cstring(what: &str, p: &std::path::Path) -> Result<CString, BackstoreError> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes()).map_err(|_| BackstoreError::Ceph {
        what: format!("{what} contains a NUL byte"),
        source: io::Error::from(io::ErrorKind::InvalidInput),
    })
}

/// A cluster connection, an I/O context and the image open on it, closed
/// in that order's reverse.
struct Image {
    cluster: ffi::rados_t,
    ioctx: ffi::rados_ioctx_t,
    image: ffi::rbd_image_t,
}

// SAFETY: librados and librbd handles are not tied to the thread that
// made them, and librbd's asynchronous calls may be made on one image from
// several threads at once (its ImageCtx locks internally; QEMU's iothreads
// do the same). `Image` is closed only by its Drop, when no one else can
// use it.
unsafe impl Send for Image {}
// SAFETY: as above: every call made through a shared `Image` is one of
// librbd's thread-safe calls on the image.
unsafe impl Sync for Image {}

impl Drop for Image {
    fn drop(&mut self) {
        // Each handle is valid (null ones skipped), used by no one else
        // (every queue holding the image is gone: it waited for its
        // requests), and closed once, the image before its I/O context
        // before the cluster connection.
        if !self.image.is_null() {
            // SAFETY: as above.
            unsafe { ffi::rbd_close(self.image) };
        }
        if !self.ioctx.is_null() {
            // SAFETY: as above.
            unsafe { ffi::rados_ioctx_destroy(self.ioctx) };
        }
        if !self.cluster.is_null() {
            // SAFETY: as above.
            unsafe { ffi::rados_shutdown(self.cluster) };
        }
    }
}

impl Image {
    /// Reads `option` of the cluster handle.
    fn conf_get(&self, option: &std::ffi::CStr) -> Option<String> {
        let mut buf = [0 as c_char; 64];
        // SAFETY: the handle is valid; librados writes at most `buf.len()`
        // bytes, NUL included, into `buf`.
        let rc = unsafe {
            ffi::rados_conf_get(self.cluster, option.as_ptr(), buf.as_mut_ptr(), buf.len())
        };
        if rc < 0 {
            return None;
        }
        // SAFETY: on success the buffer holds a NUL-terminated string.
        let value = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        Some(value.to_string_lossy().into_owned())
    }

    fn conf_set(&self, option: &str, value: &str) -> Result<(), BackstoreError> {
        let (o, v) = (cstring("option", option)?, cstring("value", value)?);
        // SAFETY: the handle is valid and unconnected; both strings are
        // NUL-terminated and outlive the call.
        let rc = unsafe { ffi::rados_conf_set(self.cluster, o.as_ptr(), v.as_ptr()) };
        if rc < 0 {
            return Err(ceph_error(format!("cannot set {option}={value}"), rc));
        }
        Ok(())
    }

    /// Connects as the options say and opens the image.
    fn open(options: &RbdOptions) -> Result<Self, BackstoreError> {
        let mut img = Image {
            cluster: ptr::null_mut(),
            ioctx: ptr::null_mut(),
            image: ptr::null_mut(),
        };
        let user = format!("client.{}", options.id.as_deref().unwrap_or("admin"));
        let name = cstring("id", &user)?;
        // SAFETY: both strings are NUL-terminated; librados writes the
        // handle to `img.cluster`, which Drop shuts down.
        let rc =
            unsafe { ffi::rados_create2(&mut img.cluster, c"ceph".as_ptr(), name.as_ptr(), 0) };
        if rc < 0 {
            img.cluster = ptr::null_mut();
            return Err(ceph_error(
                format!("cannot create a Ceph client {user}"),
                rc,
            ));
        }
        let conf = options
            .conf
            .as_deref()
            .map(|p| path_cstring("conf", p))
            .transpose()?;
        // SAFETY: the handle is valid; the path is NUL-terminated or null
        // (librados' default search).
        let rc = unsafe {
            ffi::rados_conf_read_file(
                img.cluster,
                conf.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
            )
        };
        if rc < 0 {
            let which = options.conf.as_ref().map_or_else(
                || "no Ceph configuration ($CEPH_CONF, /etc/ceph/ceph.conf)".to_owned(),
                |p| format!("cannot read the Ceph configuration {}", p.display()),
            );
            return Err(ceph_error(which, rc));
        }
        // SAFETY: the handle is valid; null means CEPH_ARGS.
        let rc = unsafe { ffi::rados_conf_parse_env(img.cluster, ptr::null()) };
        if rc < 0 {
            return Err(ceph_error("cannot parse CEPH_ARGS".to_owned(), rc));
        }
        if let Some(keyring) = &options.keyring {
            let path = keyring.to_str().ok_or_else(|| BackstoreError::Ceph {
                what: format!("keyring path {} is not UTF-8", keyring.display()),
                source: io::Error::from(io::ErrorKind::InvalidInput),
            })?;
            img.conf_set("keyring", path)?;
        }
        // No librbd cache in this process: a write is complete once the
        // OSDs have it. A daemon that is killed and restarted under a
        // running guest (in-flight resubmission) must not lose writes it
        // acknowledged, and the cache would lose every one not yet
        // flushed; QEMU's cache=none does the same.
        img.conf_set("rbd_cache", "false")?;
        for (option, ceph_default) in [
            (c"rados_osd_op_timeout", 0.0),
            (c"rados_mon_op_timeout", 0.0),
            (c"client_mount_timeout", 300.0),
        ] {
            let current = img.conf_get(option);
            if current.and_then(|v| v.trim().parse::<f64>().ok()) == Some(ceph_default) {
                img.conf_set(&option.to_string_lossy(), &DEFAULT_TIMEOUT_SECS.to_string())?;
            }
        }
        // SAFETY: the handle is valid and configured.
        let rc = unsafe { ffi::rados_connect(img.cluster) };
        if rc < 0 {
            return Err(ceph_error(
                format!("cannot connect to the Ceph cluster as {user}"),
                rc,
            ));
        }
        let pool = cstring("pool", &options.pool)?;
        // SAFETY: the connected handle is valid; librados writes the I/O
        // context to `img.ioctx`, which Drop destroys.
        let rc = unsafe { ffi::rados_ioctx_create(img.cluster, pool.as_ptr(), &mut img.ioctx) };
        if rc < 0 {
            img.ioctx = ptr::null_mut();
            return Err(ceph_error(format!("cannot open pool {}", options.pool), rc));
        }
        if let Some(ns) = &options.namespace {
            let ns = cstring("namespace", ns)?;
            // SAFETY: the I/O context is valid; librados copies the string.
            unsafe { ffi::rados_ioctx_set_namespace(img.ioctx, ns.as_ptr()) };
        }
        let image = cstring("image", &options.image)?;
        let snap = options
            .snap
            .as_deref()
            .map(|s| cstring("snap", s))
            .transpose()?;
        let snap_ptr = snap.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        let read_only = options.read_only || options.snap.is_some();
        // The I/O context is valid; the names are NUL-terminated (the
        // snapshot's or null); librbd writes the image handle to
        // `img.image`, which Drop closes.
        let rc = if read_only {
            // SAFETY: as above.
            unsafe { ffi::rbd_open_read_only(img.ioctx, image.as_ptr(), &mut img.image, snap_ptr) }
        } else {
            // SAFETY: as above.
            unsafe { ffi::rbd_open(img.ioctx, image.as_ptr(), &mut img.image, snap_ptr) }
        };
        if rc < 0 {
            img.image = ptr::null_mut();
            return Err(ceph_error(
                format!("cannot open RBD image {}", options.spec()),
                rc,
            ));
        }
        Ok(img)
    }

    /// Takes the image's exclusive lock for good (librbd's manual mode:
    /// it is not given up when another client asks for it).
    fn lock(&self, spec: &str) -> Result<(), BackstoreError> {
        // Held already (a queue started again, a frontend reconnected):
        // nothing to ask the cluster, nothing to record.
        if self.holds_lock() {
            return Ok(());
        }
        self.break_dead_predecessors_lock(spec);
        // SAFETY: the image is open.
        let rc = unsafe { ffi::rbd_lock_acquire(self.image, ffi::RBD_LOCK_MODE_EXCLUSIVE) };
        if rc >= 0 {
            self.record_owner(spec);
            return Ok(());
        }
        let what = if rc == -libc::EINVAL {
            format!(
                "RBD image {spec} has no exclusive-lock feature, so sqcqd cannot keep other \
                 writers off it (rbd feature enable {spec} exclusive-lock)"
            )
        } else {
            let owners = self.lock_owners();
            let holder = if owners.is_empty() {
                "another client".to_owned()
            } else {
                format!("the client at {}", owners.join(", "))
            };
            format!(
                "RBD image {spec}: its exclusive lock is held by {holder}: is another sqcqd, \
                 QEMU or rbd-nbd writing it? (ro or snap= serve it read-only)"
            )
        };
        Err(ceph_error(what, rc))
    }

    /// Breaks the exclusive lock when its holder is a `sqcqd` of this
    /// host, boot and PID namespace that is known to be dead (its record,
    /// see [`owner`]), blocklisting it first; anything else is left to
    /// `rbd_lock_acquire`.
    fn break_dead_predecessors_lock(&self, spec: &str) {
        // Without a blocklist, what the dead client still had in flight
        // could land after our writes: then only librbd's own wait.
        if self
            .conf_get(c"rbd_blocklist_on_break_lock")
            .is_some_and(|v| v != "true")
        {
            return;
        }
        let owners = self.lock_owners();
        let [holder] = owners.as_slice() else {
            return;
        };
        let Some(record) = self
            .metadata_get(owner::KEY)
            .and_then(|r| owner::Owner::parse(&r))
        else {
            return;
        };
        if record.client != *holder || !record.is_dead_here() {
            return;
        }
        let Ok(client) = CString::new(holder.as_str()) else {
            return;
        };
        // SAFETY: the image is open; the owner string is NUL-terminated.
        let rc = unsafe {
            ffi::rbd_lock_break(self.image, ffi::RBD_LOCK_MODE_EXCLUSIVE, client.as_ptr())
        };
        if rc < 0 {
            tracing::warn!(
                "RBD image {spec}: cannot break the exclusive lock of the dead sqcqd pid {} \
                 (client {holder}): {}; waiting for the cluster to notice its death",
                record.pid(),
                io::Error::from_raw_os_error(rc.saturating_neg())
            );
        } else {
            tracing::info!(
                "RBD image {spec}: took the exclusive lock over from the dead sqcqd pid {} \
                 (client {holder}, now blocklisted)",
                record.pid()
            );
        }
    }

    /// Writes who now holds the exclusive lock into the image's metadata,
    /// for [`Image::break_dead_predecessors_lock`] after a crash. A
    /// failure costs only that speed-up, so it is logged, not returned.
    fn record_owner(&self, spec: &str) {
        // The lock may have been broken since we took it: never pair this
        // process with another client.
        if !self.holds_lock() {
            return;
        }
        let owners = self.lock_owners();
        let [me] = owners.as_slice() else {
            return;
        };
        let Some(record) = owner::Owner::this_process(me) else {
            return;
        };
        let (Ok(key), Ok(value)) = (CString::new(owner::KEY), CString::new(record.to_record()))
        else {
            return;
        };
        // SAFETY: the image is open; both strings are NUL-terminated.
        let rc = unsafe { ffi::rbd_metadata_set(self.image, key.as_ptr(), value.as_ptr()) };
        if rc < 0 {
            tracing::warn!(
                "RBD image {spec}: cannot record the lock's owner in the image metadata ({}): \
                 a restart after a crash will wait for the cluster to notice it",
                io::Error::from_raw_os_error(rc.saturating_neg())
            );
        }
    }

    /// Whether this client holds the image's exclusive lock (false when
    /// librbd cannot say).
    fn holds_lock(&self) -> bool {
        let mut owner: c_int = 0;
        // SAFETY: the image is open; librbd writes one int to `owner`.
        let rc = unsafe { ffi::rbd_is_exclusive_lock_owner(self.image, &mut owner) };
        rc >= 0 && owner != 0
    }

    /// The image metadata value of `key`, if it has one.
    fn metadata_get(&self, key: &str) -> Option<String> {
        let key = CString::new(key).ok()?;
        let mut buf = vec![0u8; 256];
        loop {
            let mut len = buf.len();
            // SAFETY: the image is open; librbd writes at most `len`
            // bytes, NUL included, into `buf`, and sets `len` to the size
            // it needs when that is too small (-ERANGE).
            let rc = unsafe {
                ffi::rbd_metadata_get(self.image, key.as_ptr(), buf.as_mut_ptr().cast(), &mut len)
            };
            if rc == -libc::ERANGE && len > buf.len() && len <= 1 << 16 {
                buf.resize(len, 0);
                continue;
            }
            if rc < 0 {
                return None;
            }
            let value = std::ffi::CStr::from_bytes_until_nul(&buf).ok()?;
            return Some(value.to_string_lossy().into_owned());
        }
    }

    /// Gives the exclusive lock back.
    fn unlock(&self) -> io::Result<()> {
        // SAFETY: the image is open.
        let rc = unsafe { ffi::rbd_lock_release(self.image) };
        // Not holding it (EINVAL) is what was asked for.
        if rc < 0 && rc != -libc::EINVAL {
            return Err(io::Error::from_raw_os_error(rc.saturating_neg()));
        }
        Ok(())
    }

    /// The clients holding the exclusive lock, as librbd names them.
    fn lock_owners(&self) -> Vec<String> {
        let mut mode: c_int = 0;
        let mut owners: [*mut c_char; 8] = [ptr::null_mut(); 8];
        let mut count = owners.len();
        // SAFETY: the image is open; librbd fills at most `count` entries
        // of `owners` with strings it allocates, freed by the cleanup.
        let rc = unsafe {
            ffi::rbd_lock_get_owners(self.image, &mut mode, owners.as_mut_ptr(), &mut count)
        };
        if rc < 0 {
            return Vec::new();
        }
        let count = count.min(owners.len());
        let names = owners[..count]
            .iter()
            .filter(|p| !p.is_null())
            .map(|&p| {
                // SAFETY: each filled entry is a NUL-terminated string,
                // alive until the cleanup below.
                unsafe { std::ffi::CStr::from_ptr(p) }
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        // SAFETY: the entries librbd filled, freed once.
        unsafe { ffi::rbd_lock_get_owners_cleanup(owners.as_mut_ptr(), count) };
        names
    }

    /// The image's size in bytes.
    fn size(&self) -> io::Result<u64> {
        let mut size = 0u64;
        // SAFETY: the image is open; librbd writes a u64 to `size`.
        let rc = unsafe { ffi::rbd_get_size(self.image, &mut size) };
        if rc < 0 {
            return Err(io::Error::from_raw_os_error(rc.saturating_neg()));
        }
        Ok(size)
    }
}

/// What librbd's header-update callback needs: the image to read the
/// size of, the LUN's capacity to compare it with, and whom to tell.
struct WatchContext {
    image: Arc<Image>,
    capacity: Capacity,
    block_size: u64,
    changed: SizeWatcher,
}

/// A registered `rbd_update_watch`, undone by [`RbdBackstore`]'s Drop.
struct UpdateWatch {
    handle: u64,
    /// At a stable address, passed to librbd.
    context: Box<WatchContext>,
}

/// librbd's header-update callback, on one of its threads: the image was
/// resized, snapshotted, or had its features changed.
extern "C" fn on_header_update(arg: *mut std::ffi::c_void) {
    // SAFETY: `arg` is the `WatchContext` of a registered watch, freed
    // only after `rbd_update_unwatch` returned (which waits for running
    // callbacks).
    let context = unsafe { &*arg.cast::<WatchContext>() };
    // Reading the size here is what Ceph's own rbd-nbd does in its
    // update callback.
    let Ok(size) = context.image.size() else {
        return;
    };
    let bytes = size / context.block_size * context.block_size;
    if bytes > 0 && bytes != context.capacity.get() {
        (context.changed)(bytes);
    }
}

/// A backstore on a Ceph RBD image.
pub struct RbdBackstore {
    image: Arc<Image>,
    /// The header watch of [`Backstore::watch_size`], if any.
    watch: Mutex<Option<UpdateWatch>>,
    /// The geometry at open; `blocks` follows `capacity`.
    geometry: Geometry,
    capacity: Capacity,
    /// `pool/[namespace/]image[@snap]`, for messages.
    spec: String,
}

impl std::fmt::Debug for RbdBackstore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RbdBackstore")
            .field("spec", &self.spec)
            .field("geometry", &self.geometry())
            .finish_non_exhaustive()
    }
}

impl RbdBackstore {
    /// Connects to the cluster and opens the image (read-only for a
    /// snapshot). Its capacity is the image's size, in whole blocks.
    pub fn open(options: &RbdOptions) -> Result<Self, BackstoreError> {
        let block_size = options.block_size;
        if block_size != 512 && block_size != 4096 {
            return Err(BackstoreError::Geometry("block size must be 512 or 4096"));
        }
        let image = Image::open(options)?;
        let spec = options.spec();
        let read_only = options.read_only || options.snap.is_some();
        if !read_only && !options.defer_lock {
            image.lock(&spec)?;
        }
        let bytes = image.size().map_err(|source| BackstoreError::Ceph {
            what: format!("cannot read the size of {spec}"),
            source,
        })?;
        let blocks = bytes / u64::from(block_size);
        if blocks == 0 {
            return Err(BackstoreError::Geometry(
                "RBD image is smaller than one block",
            ));
        }
        let read_only = options.read_only || options.snap.is_some();
        Ok(RbdBackstore {
            image: Arc::new(image),
            watch: Mutex::new(None),
            geometry: Geometry {
                block_size,
                blocks,
                read_only,
                supports_unmap: !read_only,
                // librbd skips discards smaller than its granularity
                // (rbd_discard_granularity_bytes): not guaranteed zeros.
                unmapped_reads_zero: false,
            },
            capacity: Capacity::new(blocks * u64::from(block_size)),
            spec,
        })
    }
}

impl RbdBackstore {
    fn unwatch(&self, watch: UpdateWatch) {
        // SAFETY: the image is open and `handle` registered on it; librbd
        // waits for a running callback before returning.
        let rc = unsafe { ffi::rbd_update_unwatch(self.image.image, watch.handle) };
        if rc < 0 {
            // The callback may still come: leak its context rather than
            // free it under librbd.
            std::mem::forget(watch.context);
        }
    }
}

impl Drop for RbdBackstore {
    fn drop(&mut self) {
        let watch = self
            .watch
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(watch) = watch {
            self.unwatch(watch);
        }
    }
}

impl Backstore for RbdBackstore {
    /// Watches the image's header (`rbd_update_watch`): a resize in the
    /// cluster (`rbd resize`) reaches `changed`. Read-only images opened
    /// without a watch (`ro`, `snap=`) report `Ok(false)`.
    fn watch_size(&self, changed: SizeWatcher) -> Result<bool, BackstoreError> {
        if self.geometry.read_only {
            return Ok(false);
        }
        let mut slot = self.watch.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = slot.take() {
            self.unwatch(old);
        }
        let context = Box::new(WatchContext {
            image: Arc::clone(&self.image),
            capacity: self.capacity.clone(),
            block_size: u64::from(self.geometry.block_size),
            changed,
        });
        let mut handle = 0u64;
        let arg = ptr::from_ref::<WatchContext>(&context)
            .cast_mut()
            .cast::<std::ffi::c_void>();
        // SAFETY: the image is open; `arg` points to the boxed context,
        // kept in `self.watch` until the watch is undone.
        let rc =
            unsafe { ffi::rbd_update_watch(self.image.image, &mut handle, on_header_update, arg) };
        if rc < 0 {
            return Err(ceph_error(
                format!("cannot watch {} for resizes", self.spec),
                rc,
            ));
        }
        *slot = Some(UpdateWatch { handle, context });
        Ok(true)
    }

    /// A writable image's exclusive lock: taken when a queue starts (at
    /// the destination of a migration, its first start), given back when
    /// a migration stops the device at its source.
    fn set_active(&self, active: bool) -> Result<(), BackstoreError> {
        if self.geometry.read_only {
            return Ok(());
        }
        if active {
            self.image.lock(&self.spec)
        } else {
            self.image.unlock().map_err(|source| BackstoreError::Ceph {
                what: format!("cannot release the exclusive lock of {}", self.spec),
                source,
            })
        }
    }

    fn geometry(&self) -> Geometry {
        Geometry {
            blocks: self.capacity.get() / u64::from(self.geometry.block_size),
            ..self.geometry
        }
    }

    /// Grows the image in the cluster (`rbd_resize`) when it is smaller
    /// than `bytes`, then publishes the capacity. The daemon never
    /// shrinks an image (it would destroy data): a smaller capacity is
    /// only taken once the image is that small already (shrunk in the
    /// cluster, `rbd resize --allow-shrink`).
    fn resize(&self, bytes: u64) -> Result<Geometry, BackstoreError> {
        crate::ram::validated_geometry(bytes, self.geometry.block_size)?;
        let resize_err = |source| BackstoreError::Resize { bytes, source };
        let size = self.image.size().map_err(resize_err)?;
        if bytes < self.capacity.get() && size > bytes {
            return Err(BackstoreError::Unsupported(
                "shrinking an RBD image (shrink it in the cluster: the LUN follows)",
            ));
        }
        if bytes > size {
            if self.geometry.read_only {
                return Err(BackstoreError::ReadOnly);
            }
            // SAFETY: the image is open; librbd serialises the resize
            // with the I/O in flight.
            let rc = unsafe { ffi::rbd_resize(self.image.image, bytes) };
            if rc < 0 {
                return Err(resize_err(io::Error::from_raw_os_error(
                    rc.saturating_neg(),
                )));
            }
        }
        self.capacity.set(bytes);
        Ok(self.geometry())
    }

    fn open_queue(&self, depth: u32) -> Result<Box<dyn BackstoreQueue>, BackstoreError> {
        Ok(Box::new(queue::RbdQueue::new(
            Arc::clone(&self.image),
            depth.clamp(1, 4096),
            self.capacity.clone(),
            self.geometry.read_only,
        )?))
    }
}
