//! The few calls of librados' and librbd's C API the RBD backstore makes
//! (`<rados/librados.h>`, `<rbd/librbd.h>` of Ceph 16, Debian's
//! `librbd-dev`), declared by hand.
//!
//! The published Rust bindings do not fit: `ceph` (ceph/ceph-rust 3.2)
//! covers librados and the admin socket but not librbd, and `librbd-sys`
//! and `rbd-sys` (0.1.0 each) are unmaintained single releases. These
//! declarations are checked against the headers by the integration tests,
//! which run them against a real cluster (`scripts/ceph-cluster.sh`).

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

/// A cluster handle (`rados_t`).
pub(crate) type rados_t = *mut c_void;
/// A pool's I/O context (`rados_ioctx_t`).
pub(crate) type rados_ioctx_t = *mut c_void;
/// An open image (`rbd_image_t`).
pub(crate) type rbd_image_t = *mut c_void;
/// An asynchronous request's completion (`rbd_completion_t`).
pub(crate) type rbd_completion_t = *mut c_void;
/// `rbd_callback_t`: called once when the request completes, from one of
/// librbd's threads.
pub(crate) type rbd_callback_t = extern "C" fn(rbd_completion_t, *mut c_void);

/// `rbd_update_callback_t`: called when the image's header changes
/// (resize, snapshots, features), from one of librbd's threads.
pub(crate) type rbd_update_callback_t = extern "C" fn(*mut c_void);

/// `RBD_LOCK_MODE_EXCLUSIVE` of `rbd_lock_mode_t`.
pub(crate) const RBD_LOCK_MODE_EXCLUSIVE: c_int = 0;

#[link(name = "rados")]
unsafe extern "C" {
    pub(crate) fn rados_create2(
        cluster: *mut rados_t,
        cluster_name: *const c_char,
        name: *const c_char,
        flags: u64,
    ) -> c_int;
    pub(crate) fn rados_conf_read_file(cluster: rados_t, path: *const c_char) -> c_int;
    pub(crate) fn rados_conf_parse_env(cluster: rados_t, var: *const c_char) -> c_int;
    pub(crate) fn rados_conf_set(
        cluster: rados_t,
        option: *const c_char,
        value: *const c_char,
    ) -> c_int;
    pub(crate) fn rados_conf_get(
        cluster: rados_t,
        option: *const c_char,
        buf: *mut c_char,
        len: usize,
    ) -> c_int;
    pub(crate) fn rados_connect(cluster: rados_t) -> c_int;
    pub(crate) fn rados_shutdown(cluster: rados_t);
    pub(crate) fn rados_ioctx_create(
        cluster: rados_t,
        pool_name: *const c_char,
        ioctx: *mut rados_ioctx_t,
    ) -> c_int;
    pub(crate) fn rados_ioctx_set_namespace(io: rados_ioctx_t, nspace: *const c_char);
    pub(crate) fn rados_ioctx_destroy(io: rados_ioctx_t);
}

#[link(name = "rbd")]
unsafe extern "C" {
    pub(crate) fn rbd_open(
        io: rados_ioctx_t,
        name: *const c_char,
        image: *mut rbd_image_t,
        snap_name: *const c_char,
    ) -> c_int;
    pub(crate) fn rbd_open_read_only(
        io: rados_ioctx_t,
        name: *const c_char,
        image: *mut rbd_image_t,
        snap_name: *const c_char,
    ) -> c_int;
    pub(crate) fn rbd_close(image: rbd_image_t) -> c_int;
    pub(crate) fn rbd_get_size(image: rbd_image_t, size: *mut u64) -> c_int;
    pub(crate) fn rbd_resize(image: rbd_image_t, size: u64) -> c_int;
    pub(crate) fn rbd_lock_acquire(image: rbd_image_t, lock_mode: c_int) -> c_int;
    pub(crate) fn rbd_is_exclusive_lock_owner(image: rbd_image_t, is_owner: *mut c_int) -> c_int;
    pub(crate) fn rbd_lock_release(image: rbd_image_t) -> c_int;
    pub(crate) fn rbd_lock_break(
        image: rbd_image_t,
        lock_mode: c_int,
        lock_owner: *const c_char,
    ) -> c_int;
    pub(crate) fn rbd_metadata_get(
        image: rbd_image_t,
        key: *const c_char,
        value: *mut c_char,
        val_len: *mut usize,
    ) -> c_int;
    pub(crate) fn rbd_metadata_set(
        image: rbd_image_t,
        key: *const c_char,
        value: *const c_char,
    ) -> c_int;
    pub(crate) fn rbd_lock_get_owners(
        image: rbd_image_t,
        lock_mode: *mut c_int,
        lock_owners: *mut *mut c_char,
        max_lock_owners: *mut usize,
    ) -> c_int;
    pub(crate) fn rbd_update_watch(
        image: rbd_image_t,
        handle: *mut u64,
        watch_cb: rbd_update_callback_t,
        arg: *mut c_void,
    ) -> c_int;
    pub(crate) fn rbd_update_unwatch(image: rbd_image_t, handle: u64) -> c_int;
    pub(crate) fn rbd_lock_get_owners_cleanup(lock_owners: *mut *mut c_char, count: usize);

    pub(crate) fn rbd_aio_create_completion(
        cb_arg: *mut c_void,
        complete_cb: rbd_callback_t,
        c: *mut rbd_completion_t,
    ) -> c_int;
    pub(crate) fn rbd_aio_get_return_value(c: rbd_completion_t) -> isize;
    pub(crate) fn rbd_aio_release(c: rbd_completion_t);
    pub(crate) fn rbd_aio_readv(
        image: rbd_image_t,
        iov: *const libc::iovec,
        iovcnt: c_int,
        off: u64,
        c: rbd_completion_t,
    ) -> c_int;
    pub(crate) fn rbd_aio_writev(
        image: rbd_image_t,
        iov: *const libc::iovec,
        iovcnt: c_int,
        off: u64,
        c: rbd_completion_t,
    ) -> c_int;
    pub(crate) fn rbd_aio_flush(image: rbd_image_t, c: rbd_completion_t) -> c_int;
    pub(crate) fn rbd_aio_discard(
        image: rbd_image_t,
        off: u64,
        len: u64,
        c: rbd_completion_t,
    ) -> c_int;
    pub(crate) fn rbd_aio_write_zeroes(
        image: rbd_image_t,
        off: u64,
        len: usize,
        c: rbd_completion_t,
        zero_flags: c_int,
        op_flags: c_int,
    ) -> c_int;
}
