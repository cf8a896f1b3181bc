//! Group commit: concurrent writers share one fsync.
//!
//! Writers append under the store's lock (cheap: a `write(2)` into the page cache), release it,
//! and then wait here until their [`Position`] is durable. The first waiter to find no fsync in
//! flight becomes the leader: it asks for the current end of the log (which covers its own
//! record and every record appended before the ask), fsyncs without holding any lock, publishes
//! the new durable position and wakes everyone. Waiters whose records were appended meanwhile
//! either find themselves covered, or one of them leads the next fsync. Under load a single
//! fsync thus acknowledges every writer that arrived while the previous one ran.
//!
//! When an fsync fails, its segment is marked failed: no position in it is ever reported durable
//! again (Linux may drop the dirty pages and report the next fsync as a success), the writers
//! waiting on it get the error, and the log moves to a new segment.

use gpuwatch_common::metrics::prometheus_client::metrics::histogram::Histogram;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::Position;
use crate::{Error, Result};

/// What one fsync covers: the open segment's file and the log's end when it was asked for.
#[derive(Debug, Clone)]
pub struct SyncTarget {
    /// The open segment.
    pub file: Arc<File>,
    /// The end of the log when the target was taken.
    pub position: Position,
    /// The segment's path, for error messages.
    pub path: PathBuf,
}

#[derive(Debug, Default)]
struct State {
    durable: Position,
    leader: bool,
    /// Segments up to and including this one are never acknowledged again (0: none).
    failed_through: u64,
    last_error: Option<String>,
}

/// Shares fsyncs between concurrent writers.
#[derive(Debug)]
pub struct GroupCommit {
    state: Mutex<State>,
    cv: Condvar,
    fsyncs: AtomicU64,
    /// How long each fsync took (`gpuwatch_wal_fsync_duration_seconds`).
    fsync_seconds: Histogram,
}

impl Default for GroupCommit {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            cv: Condvar::new(),
            fsyncs: AtomicU64::new(0),
            fsync_seconds: gpuwatch_common::metrics::latency_histogram(),
        }
    }
}

impl GroupCommit {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The latency of the fsyncs, for the server's metrics registry.
    pub fn fsync_seconds(&self) -> &Histogram {
        &self.fsync_seconds
    }

    /// Fsyncs performed so far.
    pub fn fsyncs(&self) -> u64 {
        self.fsyncs.load(Ordering::Relaxed)
    }

    /// The durable end of the log.
    pub fn durable(&self) -> Position {
        self.lock().durable
    }

    /// Records that segment `seq` is damaged: none of its records are acknowledged from now on.
    pub fn fail(&self, seq: u64, why: &str) {
        let mut s = self.lock();
        s.failed_through = s.failed_through.max(seq);
        s.last_error = Some(why.to_string());
        drop(s);
        self.cv.notify_all();
    }

    /// Waits until `pos` is durable, leading an fsync when none is in flight. `target` gives the
    /// log's current end (taken under the store's lock); `on_failure` is told which segment's
    /// fsync failed so that the log stops appending to it.
    pub fn wait_durable(
        &self,
        pos: Position,
        target: impl Fn() -> Option<SyncTarget>,
        on_failure: impl Fn(u64),
    ) -> Result<()> {
        let mut s = self.lock();
        loop {
            if pos.seq <= s.failed_through {
                let why = s.last_error.clone().unwrap_or_default();
                return Err(Error::io(
                    PathBuf::from("wal"),
                    std::io::Error::other(format!(
                        "write-ahead log segment {} could not be made durable ({why}); the write was not acknowledged: retry it",
                        pos.seq
                    )),
                ));
            }
            if s.durable >= pos {
                return Ok(());
            }
            if s.leader {
                s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            s.leader = true;
            drop(s);
            let Some(t) = target() else {
                s = self.lock();
                s.leader = false;
                self.cv.notify_all();
                return Err(Error::ReadOnly);
            };
            let started = std::time::Instant::now();
            let synced = t.file.sync_data();
            self.fsync_seconds.observe(started.elapsed().as_secs_f64());
            self.fsyncs.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = &synced {
                on_failure(t.position.seq);
                tracing::error!(segment = %t.path.display(), error = %e, "write-ahead log fsync failed; moving to a new segment");
            }
            s = self.lock();
            s.leader = false;
            match synced {
                Ok(()) => s.durable = s.durable.max(t.position),
                Err(e) => {
                    s.failed_through = s.failed_through.max(t.position.seq);
                    s.last_error = Some(e.to_string());
                }
            }
            self.cv.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::Wal;
    use std::sync::Mutex as StdMutex;

    #[test]
    fn concurrent_writers_share_fsyncs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wal = Arc::new(StdMutex::new(Wal::create(dir.path(), 1).expect("create")));
        let gc = Arc::new(GroupCommit::default());
        let writers = 8;
        let per_writer = 50;
        std::thread::scope(|scope| {
            for w in 0..writers {
                let wal = Arc::clone(&wal);
                let gc = Arc::clone(&gc);
                scope.spawn(move || {
                    for i in 0..per_writer {
                        let payload = vec![w as u8; 100 + i];
                        let pos = wal.lock().expect("lock").append(&payload).expect("append");
                        gc.wait_durable(
                            pos,
                            || Some(wal.lock().expect("lock").sync_target()),
                            |_| {},
                        )
                        .expect("durable");
                        assert!(gc.durable() >= pos);
                    }
                });
            }
        });
        let writes = (writers * per_writer) as u64;
        assert!(
            gc.fsyncs() >= 1 && gc.fsyncs() < writes,
            "{} fsyncs for {writes} writes: none shared",
            gc.fsyncs()
        );
        // Every record is there, whole.
        let segs = crate::wal::list_segments(dir.path()).expect("list");
        let report = crate::wal::read_segment(&segs[0].1, |_| Ok(())).expect("read");
        assert_eq!(report.records, writes);
        assert!(!report.damaged(), "{report:?}");
    }

    #[test]
    fn a_failed_segment_is_never_acknowledged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = Wal::create(dir.path(), 3).expect("create");
        let pos = wal.append(b"x").expect("append");
        let gc = GroupCommit::default();
        gc.fail(3, "injected");
        let err = gc
            .wait_durable(pos, || Some(wal.sync_target()), |_| {})
            .expect_err("failed segment");
        assert!(err.to_string().contains("not acknowledged"), "{err}");
        // A new segment is acknowledged again.
        wal.mark_broken(3);
        let pos = wal.append(b"y").expect("append");
        assert_eq!(pos.seq, 4);
        gc.wait_durable(pos, || Some(wal.sync_target()), |_| {})
            .expect("durable");
    }
}
