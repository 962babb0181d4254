//! The vhost-user messages, one by one (`VhostUserBackendReqHandlerMut`
//! for [`Session`]). `vhost`'s `BackendReqHandler` has already checked the
//! message framing and sizes; every value in a message is checked here.
//!
//! Negotiation is strict: SET_FEATURES and SET_PROTOCOL_FEATURES with a
//! bit that was not offered fail. Messages for features not offered
//! (memory slots, device state, shared objects) are refused. In-flight
//! tracking is [`crate::runtime::tracking`]; dirty logging (VHOST_F_LOG_ALL
//! with SET_LOG_BASE) marks through the memory map's bitmaps
//! ([`crate::runtime::guest::DirtyLog`]).

use std::fs::File;
use std::os::fd::AsRawFd;

use tracing::{debug, info, warn};
use vhost::VhostUserMemoryRegionBase;
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight,
    VhostUserLog, VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserShMemConfig,
    VhostUserSharedMsg, VhostUserSingleMemoryRegion, VhostUserVirtioFeatures,
    VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::{Backend, Error, GpuBackend, Result, VhostUserBackendReqHandlerMut};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};

use crate::runtime::eventfd::{FdRole, PeerEventFd, Signal};
use crate::runtime::guest::{DirtyLog, GuestMem};
use crate::runtime::metrics::DeviceMetrics;
use crate::runtime::tracking::InflightArea;
use crate::transport::backend_channel::BackendChannel;
use crate::transport::session::Session;
use crate::transport::shared_map::{SharedMap, sealed_memfd};

/// Virtio features every device offers (the device type's own bits, and
/// VIRTIO_F_SQCQ_POLL unless withheld, come on top:
/// [`Session::offered_features`]).
pub const OFFERED_FEATURES: u64 = (1 << VIRTIO_F_VERSION_1)
    | (1 << VIRTIO_RING_F_EVENT_IDX)
    | (1 << VIRTIO_RING_F_INDIRECT_DESC)
    | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    | VhostUserVirtioFeatures::LOG_ALL.bits();

/// vhost-user protocol features the device offers.
pub fn offered_protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::CONFIG
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::RESET_DEVICE
        | VhostUserProtocolFeatures::BACKEND_REQ
        | VhostUserProtocolFeatures::INFLIGHT_SHMFD
        | VhostUserProtocolFeatures::LOG_SHMFD
}

fn not_supported<T>() -> Result<T> {
    Err(Error::InvalidOperation("not supported by this device"))
}

/// Checks a kick, call or error descriptor (see [`crate::runtime::eventfd`]); a
/// descriptor that is not a usable eventfd fails the message.
fn eventfd(session: &Session, file: Option<File>, role: FdRole) -> Result<Option<PeerEventFd>> {
    file.map(|f| PeerEventFd::adopt(f, role))
        .transpose()
        .map_err(|e| {
            warn!(device = session.dev.info.id, "{e}");
            Error::InvalidParam
        })
}

/// The largest dirty log a frontend may hand over: one bit per 4 KiB
/// page of 8 TiB of guest memory.
const MAX_DIRTY_LOG: u64 = 256 << 20;

/// The largest in-flight area a frontend may hand over (every vring of
/// the largest queue size fits in far less).
const MAX_INFLIGHT_AREA: u64 = 64 << 20;

impl Session {
    /// The number of queues and the queue size of an in-flight area, if
    /// the device can have them.
    fn inflight_shape(&self, m: &VhostUserInflight) -> Result<(u16, u16)> {
        if m.num_queues == 0
            || usize::from(m.num_queues) > self.max_vrings()
            || m.queue_size == 0
            || m.queue_size > 32768
        {
            return Err(Error::InvalidParam);
        }
        Ok((m.num_queues, m.queue_size))
    }

    /// Maps `len` bytes of `file` at `offset` as the in-flight area of
    /// this connection; queues started from now on keep their records
    /// there.
    fn adopt_inflight(
        &mut self,
        file: &File,
        offset: u64,
        len: u64,
        num_queues: u16,
        queue_size: u16,
    ) -> Result<()> {
        let refuse = |what: &dyn std::fmt::Display| {
            warn!(device = self.dev.info.id, "in-flight area refused: {what}");
            Error::InvalidParam
        };
        let map = SharedMap::map(file, offset, len, self.dev.memory_fault.as_raw_fd())
            .map_err(|e| refuse(&crate::runtime::error_chain(&e)))?;
        let (ptr, size) = (map.ptr(), map.len());
        // SAFETY: the mapping is `size` bytes, page-aligned, and lives as
        // long as the area (it is the area's keeper).
        let area = unsafe { InflightArea::new(ptr, size, num_queues, queue_size, Box::new(map)) }
            .map_err(|e| refuse(&e))?;
        self.inflight = Some(std::sync::Arc::new(area));
        Ok(())
    }

    fn index(&mut self, index: u32) -> Result<usize> {
        let i = usize::try_from(index).map_err(|_| Error::InvalidParam)?;
        self.vring(i).ok_or(Error::InvalidParam)?;
        Ok(i)
    }

    fn va_to_gpa(&self, va: u64) -> Result<u64> {
        self.mappings
            .iter()
            .find(|m| va >= m.user_addr && va - m.user_addr < m.size)
            .map(|m| va - m.user_addr + m.gpa)
            .ok_or(Error::InvalidParam)
    }
}

/// Why `log` cannot serve `mem`: it covers fewer pages than `mem` has up
/// to its last address.
pub(crate) fn log_too_small(log: &DirtyLog, mem: &GuestMem) -> Option<String> {
    use vm_memory::GuestMemoryBackend;
    let needed = crate::runtime::guest::log_bytes_needed(mem);
    let len = u64::try_from(log.len()).unwrap_or(u64::MAX);
    (len < needed).then(|| {
        format!(
            "{len} bytes of log for guest memory up to {:#x}, which needs {needed}",
            mem.last_addr().0
        )
    })
}

impl VhostUserBackendReqHandlerMut for Session {
    fn set_owner(&mut self) -> Result<()> {
        if self.owned {
            return Err(Error::InvalidOperation("already owned"));
        }
        self.owned = true;
        Ok(())
    }

    fn reset_owner(&mut self) -> Result<()> {
        self.reset_rings();
        self.owned = false;
        self.acked_protocol = 0;
        self.backend_channel = None;
        self.inflight = None;
        self.log = None;
        Ok(())
    }

    fn reset_device(&mut self) -> Result<()> {
        info!(device = self.dev.info.id, "device reset");
        self.reset_rings();
        // What the driver had in flight died with its reset.
        if let Some(a) = &self.inflight {
            a.clear();
        }
        Ok(())
    }

    fn get_features(&mut self) -> Result<u64> {
        Ok(self.offered_features())
    }

    fn set_features(&mut self, features: u64) -> Result<()> {
        if features & !self.offered_features() != 0 {
            return Err(Error::InvalidParam);
        }
        self.acked_features = features;
        debug!(device = self.dev.info.id, "features {features:#x}");
        // VHOST_F_LOG_ALL on or off (QEMU at the start and the end of a
        // migration).
        if !self.sync_logging() {
            return Err(Error::BackendInternalError);
        }
        if features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() == 0 {
            // Without VHOST_USER_F_PROTOCOL_FEATURES rings start enabled.
            for i in 0..self.vrings.len() {
                self.vrings[i].enabled = true;
                self.update(i);
            }
        }
        Ok(())
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        postcopy_listening: Option<bool>,
    ) -> Result<Option<Vec<VhostUserMemoryRegionBase>>> {
        if postcopy_listening.is_some() {
            return not_supported();
        }
        let shared = crate::transport::memory::map(ctx, files, self.dev.memory_fault.as_raw_fd())
            .map_err(|e| {
            warn!(
                device = self.dev.info.id,
                "memory table refused: {}",
                crate::runtime::error_chain(&e)
            );
            Error::InvalidParam
        })?;
        // Memory grown past the log while logging: the pages beyond it
        // could not be marked. QEMU grows the log first (SET_LOG_BASE);
        // a frontend that does not would lose them in the migration, so
        // the connection ends, as for a log that cannot be used.
        if self.logging()
            && let Some(log) = &self.log
            && let Some(why) = log_too_small(log, &shared.map)
        {
            self.fatal = Some(format!("memory table refused while logging: {why}"));
            return Err(Error::InvalidParam);
        }
        // Workers load the map once per pass: the swap takes effect at
        // their next pass; requests in flight keep the old map alive, and
        // its regions stay mapped until they are done.
        self.mem
            .replace(shared.map)
            .map_err(|_| Error::BackendInternalError)?;
        self.mappings = shared.mappings;
        let old = std::mem::replace(&mut self.regions, shared.regions);
        self.retired.extend(old);
        self.release_retired();
        // Polling workers rebuild their doorbells on the new map before
        // they sleep again.
        self.pool.nudge_all();
        info!(
            device = self.dev.info.id,
            regions = ctx.len(),
            "memory table set"
        );
        if self.logging() && !self.remap() {
            return Err(Error::BackendInternalError);
        }
        for i in 0..self.vrings.len() {
            self.update(i);
        }
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> Result<()> {
        let i = self.index(index)?;
        let max = u32::from(self.dev.params.queue_size);
        // A split ring's size is a power of two; a packed ring's any size
        // up to the maximum (virtio 1.2, 2.7 and 2.8).
        if num == 0 || num > max || !(num.is_power_of_two() || self.packed()) {
            return Err(Error::InvalidParam);
        }
        let v = &mut self.vrings[i];
        v.size = u16::try_from(num).map_err(|_| Error::InvalidParam)?;
        Ok(())
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        _flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        _log: u64,
    ) -> Result<()> {
        let i = self.index(index)?;
        let addrs = (
            self.va_to_gpa(descriptor)?,
            self.va_to_gpa(available)?,
            self.va_to_gpa(used)?,
        );
        self.vrings[i].addrs = Some(addrs);
        self.update(i);
        Ok(())
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> Result<()> {
        let i = self.index(index)?;
        // A split ring's base is its next avail index; a packed ring's
        // holds two positions (`runtime::packed::encode_base`), which
        // `Ring::open` checks against the ring when the queue starts.
        if !self.packed() && base > u32::from(u16::MAX) {
            return Err(Error::InvalidParam);
        }
        self.vrings[i].base = base;
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> Result<VhostUserVringState> {
        let i = self.index(index)?;
        self.stop(i);
        let v = &mut self.vrings[i];
        v.kick = None;
        v.call = None;
        Ok(VhostUserVringState::new(index, v.base))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        let i = self.index(u32::from(index))?;
        let kick = eventfd(self, fd, FdRole::Kick)?;
        // A new kick fd restarts the ring, which then looks at it once.
        self.stop(i);
        self.vrings[i].kick = kick;
        self.update(i);
        Ok(())
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        let i = self.index(u32::from(index))?;
        let call = eventfd(self, fd, FdRole::Call)?;
        // Signalled once at once, as libvhost-user (and so every QEMU
        // back-end) does in `vu_set_vring_call_exec`: a driver that
        // reconnected, or whose frontend replaced the call descriptor while
        // completions were published, looks at its used ring instead of
        // waiting for a call that went to the old descriptor. A spurious
        // interrupt costs a driver one look; QEMU's vhost-user-blk test
        // waits for exactly this one.
        if let Some(call) = &call
            && let Signal::Failed(_) | Signal::Stalled = call.signal()
        {
            warn!(
                device = self.dev.info.id,
                vring = i,
                "the new call eventfd cannot be signalled"
            );
            return Err(Error::InvalidParam);
        }
        self.vrings[i].call = call;
        self.update_call(i);
        Ok(())
    }

    fn set_vring_err(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        let i = self.index(u32::from(index))?;
        self.vrings[i].err = eventfd(self, fd, FdRole::Err)?;
        self.update_err(i);
        Ok(())
    }

    fn get_protocol_features(&mut self) -> Result<VhostUserProtocolFeatures> {
        Ok(offered_protocol_features())
    }

    fn set_protocol_features(&mut self, features: u64) -> Result<()> {
        if features & !offered_protocol_features().bits() != 0 {
            return Err(Error::InvalidParam);
        }
        self.acked_protocol = features;
        Ok(())
    }

    fn get_queue_num(&mut self) -> Result<u64> {
        Ok(u64::try_from(self.queue_num()).unwrap_or(u64::MAX))
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> Result<()> {
        let i = self.index(index)?;
        self.vrings[i].enabled = enable;
        self.update(i);
        Ok(())
    }

    fn get_config(
        &mut self,
        offset: u32,
        size: u32,
        _flags: VhostUserConfigFlags,
    ) -> Result<Vec<u8>> {
        config_read(&self.device.config_space(), offset, size)
    }

    fn set_config(&mut self, offset: u32, buf: &[u8], _flags: VhostUserConfigFlags) -> Result<()> {
        if self.device.write_config(offset, buf) {
            Ok(())
        } else {
            Err(Error::InvalidParam)
        }
    }

    fn set_backend_req_fd(&mut self, backend: Backend) {
        // `vhost` checked the protocol feature and that the descriptor is
        // a stream socket; its `Backend` cannot send what the device
        // sends, so the duplicate peeked before the message was read
        // takes its place (`backend` closes its own copy).
        drop(backend);
        self.backend_channel = self.peeked_backend_fd.take().map(BackendChannel::new);
    }

    fn set_gpu_socket(&mut self, _gpu_backend: GpuBackend) -> Result<()> {
        not_supported()
    }

    fn get_shared_object(&mut self, _uuid: VhostUserSharedMsg) -> Result<File> {
        not_supported()
    }

    fn get_inflight_fd(
        &mut self,
        inflight: &VhostUserInflight,
    ) -> Result<(VhostUserInflight, File)> {
        let (num_queues, queue_size) = self.inflight_shape(inflight)?;
        // Room for packed regions (twice a split ring's) when packed rings
        // may be negotiated: QEMU asks after SET_FEATURES, but nothing
        // says every frontend does.
        let packed = self.offered_features()
            & (1 << virtio_bindings::bindings::virtio_config::VIRTIO_F_RING_PACKED)
            != 0;
        let len = u64::try_from(InflightArea::size_for(num_queues, queue_size, packed))
            .map_err(|_| Error::InvalidParam)?;
        let file = sealed_memfd(c"sqcq-inflight", len).map_err(|e| {
            warn!(
                device = self.dev.info.id,
                "in-flight area: {}",
                crate::runtime::error_chain(&e)
            );
            Error::BackendInternalError
        })?;
        self.adopt_inflight(&file, 0, len, num_queues, queue_size)?;
        info!(
            device = self.dev.info.id,
            num_queues, queue_size, "in-flight area created"
        );
        Ok((VhostUserInflight::new(len, 0, num_queues, queue_size), file))
    }

    fn set_inflight_fd(&mut self, inflight: &VhostUserInflight, file: File) -> Result<()> {
        let (num_queues, queue_size) = self.inflight_shape(inflight)?;
        if inflight.mmap_size > MAX_INFLIGHT_AREA {
            return Err(Error::InvalidParam);
        }
        self.adopt_inflight(
            &file,
            inflight.mmap_offset,
            inflight.mmap_size,
            num_queues,
            queue_size,
        )?;
        let resumed = self.inflight.as_ref().is_some_and(|a| a.used_before());
        info!(
            device = self.dev.info.id,
            num_queues, queue_size, resumed, "in-flight area set"
        );
        if resumed {
            self.device.resumed();
        }
        Ok(())
    }

    fn get_max_mem_slots(&mut self) -> Result<u64> {
        not_supported()
    }

    fn add_mem_region(
        &mut self,
        _region: &VhostUserSingleMemoryRegion,
        _fd: File,
        _postcopy_listening: Option<bool>,
    ) -> Result<Option<VhostUserMemoryRegionBase>> {
        not_supported()
    }

    fn remove_mem_region(&mut self, _region: &VhostUserSingleMemoryRegion) -> Result<()> {
        not_supported()
    }

    fn set_device_state_fd(
        &mut self,
        _direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        _fd: File,
    ) -> Result<Option<File>> {
        not_supported()
    }

    fn check_device_state(&mut self) -> Result<()> {
        not_supported()
    }

    fn get_shmem_config(&mut self) -> Result<VhostUserShMemConfig> {
        not_supported()
    }

    fn set_log_base(&mut self, log: &VhostUserLog, file: File) -> Result<()> {
        // The frontend waits for a reply, which a refusal does not send,
        // and a migration without the device's marks would lose data: a
        // log that cannot be used ends the connection.
        let mut refuse = |why: String| {
            self.fatal = Some(format!("dirty log refused: {why}"));
            Error::InvalidParam
        };
        if log.mmap_size > MAX_DIRTY_LOG {
            return Err(refuse(format!("{} bytes is too large", log.mmap_size)));
        }
        let map = SharedMap::map(
            &file,
            log.mmap_offset,
            log.mmap_size,
            self.dev.memory_fault.as_raw_fd(),
        )
        .map_err(|e| refuse(crate::runtime::error_chain(&e)))?;
        let (ptr, len) = (map.ptr(), map.len());
        // Pages beyond the log (none: its size is checked below and at
        // every memory change) are counted and logged, rate-limited.
        let info = std::sync::Arc::clone(&self.dev.info);
        let lost = Box::new(move |gpa: u64| {
            DeviceMetrics::bump(&info.metrics.log_marks_lost);
            crate::guest_warn!(
                info.limiter,
                device = info.id,
                "page {gpa:#x} written beyond the end of the dirty log: not marked"
            );
        });
        // SAFETY: the mapping is `len` bytes and lives as long as the log
        // (it is the log's keeper).
        let dirty = unsafe { DirtyLog::new(ptr, len, Box::new(map), lost) };
        // A log that does not reach the end of guest memory would leave
        // the pages past it unmarked, and the migration would copy them
        // stale. (Without a memory table yet, SET_MEM_TABLE checks.)
        if let Some(why) = log_too_small(&dirty, &self.mem.memory()) {
            return Err(refuse(why));
        }
        self.log = Some(std::sync::Arc::new(dirty));
        info!(device = self.dev.info.id, size = len, "dirty log set");
        // A log replaced while logging (QEMU resizes it when memory
        // grows): the map points at the new one.
        if self.logging() && !self.remap() {
            return Err(Error::BackendInternalError);
        }
        Ok(())
    }
}

/// The largest configuration read a frontend may ask for: the payload of
/// a VHOST_USER_GET_CONFIG message.
const MAX_CONFIG_READ: usize = 256;

/// `size` bytes of the configuration space from `offset`. A read that
/// runs past the end of `space` (but not past the message's 256-byte
/// payload) gets zeros there: SPDK's virtio-user initiator asks for all
/// 256 bytes whatever the device, and takes its fields from the front, as
/// SPDK's own target answers it. A read that starts past the space is
/// refused.
fn config_read(space: &[u8], offset: u32, size: u32) -> Result<Vec<u8>> {
    let start = usize::try_from(offset).map_err(|_| Error::InvalidParam)?;
    let len = usize::try_from(size).map_err(|_| Error::InvalidParam)?;
    let end = start.checked_add(len).ok_or(Error::InvalidParam)?;
    if start > space.len() || end > MAX_CONFIG_READ.max(space.len()) {
        return Err(Error::InvalidParam);
    }
    let mut out = vec![0; len];
    let present = &space[start..end.min(space.len())];
    out[..present.len()].copy_from_slice(present);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_past_the_space_get_zeros_up_to_the_payload() {
        let space = [1, 2, 3, 4];
        assert_eq!(config_read(&space, 1, 2).unwrap(), [2, 3]);
        let whole = config_read(&space, 0, 256).unwrap();
        assert_eq!(whole.len(), 256);
        assert_eq!(whole[..4], space);
        assert!(whole[4..].iter().all(|&b| b == 0));
        assert_eq!(config_read(&space, 4, 0).unwrap(), [0u8; 0]);
        assert!(config_read(&space, 5, 1).is_err(), "starts past the space");
        assert!(config_read(&space, 0, 257).is_err(), "past the payload");
        assert!(config_read(&space, 2, u32::MAX).is_err());
    }
}
