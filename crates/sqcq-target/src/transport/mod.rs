//! vhost-user, for any device type ([`device_type`]): one control thread
//! per device socket ([`device`]), the session of a connected frontend
//! (`session`, `handler`: features, protocol features, memory table,
//! vrings, the backend channel), and the guards that keep a hostile frontend to its own
//! connection (`vhost_socket`, `listen`, `memory`, `sigbus`).

pub(crate) mod backend_channel;
pub mod device;
pub mod device_type;
pub(crate) mod handler;
pub mod listen;
pub(crate) mod memory;
pub(crate) mod session;
pub(crate) mod shared_map;
pub(crate) mod sigbus;
pub(crate) mod vhost_socket;
