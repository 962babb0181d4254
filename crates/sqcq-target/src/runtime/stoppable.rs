//! A thread that serves until told to stop: it watches a stop eventfd it
//! is given, and its owner signals it and joins it (at shutdown, or when
//! dropped). The admin socket, the metrics endpoint and each device's
//! control thread are one.

use std::io;
use std::thread::JoinHandle;

use tracing::error;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

/// A running thread and its stop eventfd.
#[derive(Debug)]
pub struct StoppableThread {
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
    /// What it is, for the log if it panicked.
    what: String,
}

impl StoppableThread {
    /// Starts thread `name` running `run`, which gets the stop eventfd to
    /// watch (readable once it must end).
    pub fn spawn(
        name: String,
        what: String,
        run: impl FnOnce(EventFd) + Send + 'static,
    ) -> io::Result<Self> {
        let stop = EventFd::new(EFD_NONBLOCK)?;
        let theirs = stop.try_clone()?;
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || run(theirs))?;
        Ok(StoppableThread {
            stop,
            thread: Some(thread),
            what,
        })
    }

    /// Tells it to stop and waits until it ended.
    pub fn stop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            error!("{} panicked", self.what);
        }
    }
}

impl Drop for StoppableThread {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_sees_the_stop_and_is_joined() {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut t = StoppableThread::spawn("t".into(), "test thread".into(), move |stop| {
            // Blocks until the owner signals.
            let n = loop {
                match stop.read() {
                    Ok(n) => break n,
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
                }
            };
            tx.send(n).unwrap();
        })
        .unwrap();
        assert!(rx.try_recv().is_err(), "running until told");
        t.stop();
        assert_eq!(rx.try_recv(), Ok(1), "ended before stop returned");
    }
}
