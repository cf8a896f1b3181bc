//! Where queries run: a Tokio runtime of their own, apart from the one that answers `/healthz`,
//! takes writes and acknowledges them.
//!
//! A query can keep every thread it runs on busy (a large sort, a regex over long strings, an
//! answer being encoded); on the server's own runtime that would delay health checks and ingest
//! by as long. On the query runtime, whose threads also run at a lower scheduling priority
//! (nice [`QUERY_NICE`]), the kernel gives the server's threads the CPU first whenever they
//! want it. [`Executor::current`] runs queries where they are started (tests, tools).

use std::future::Future;

use tokio::runtime::{Handle, Runtime};
use tokio::task::JoinHandle;

/// The nice value of the query threads (0 is the server's; higher is less favoured).
pub const QUERY_NICE: i32 = 10;

/// The stack of each query thread.
pub const QUERY_STACK_BYTES: usize = 16 << 20;

/// Runs queries: on a dedicated runtime, or on the caller's.
#[derive(Debug, Clone, Default)]
pub struct Executor {
    handle: Option<Handle>,
}

impl Executor {
    /// Runs queries on the runtime they are started from.
    pub fn current() -> Self {
        Self::default()
    }

    /// A runtime of `threads` threads for queries (the caller keeps it alive), and an executor
    /// on it.
    pub fn dedicated(threads: usize) -> std::io::Result<(Runtime, Self)> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("gpuwatch-query")
            // Planning walks expression trees recursively; gate::MAX_OPERATORS keeps them
            // shallow enough for this (reserved, not resident: pages are used as touched).
            .thread_stack_size(QUERY_STACK_BYTES)
            .enable_all()
            .on_thread_start(lower_priority)
            .build()?;
        let handle = runtime.handle().clone();
        Ok((
            runtime,
            Self {
                handle: Some(handle),
            },
        ))
    }

    /// Starts `work` on the query runtime.
    pub fn spawn<F>(&self, work: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.handle {
            Some(h) => h.spawn(work),
            None => tokio::spawn(work),
        }
    }
}

/// Aborts its task when dropped: a query whose client went away, or that ran out of time, stops.
#[derive(Debug)]
pub struct AbortOnDrop<T>(pub JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Lowers the calling thread's scheduling priority to [`QUERY_NICE`].
#[allow(unsafe_code)]
fn lower_priority() {
    // SAFETY: setpriority takes plain integers and touches no memory of ours; on Linux,
    // PRIO_PROCESS with who = 0 applies to the calling thread only.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, QUERY_NICE) };
    if rc != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "cannot lower the query thread's priority"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedicated_threads_run_at_the_lower_priority() {
        let (runtime, executor) = Executor::dedicated(1).expect("runtime");
        let outer = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("outer runtime");
        let (name, nice) = outer.block_on(async {
            executor
                .spawn(async {
                    let name = std::thread::current().name().map(str::to_owned);
                    // /proc/thread-self/stat: field 19 is the nice value.
                    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("stat");
                    let after = &stat[stat.rfind(')').expect("comm") + 2..];
                    let nice: i32 = after
                        .split_whitespace()
                        .nth(16)
                        .expect("nice field")
                        .parse()
                        .expect("number");
                    (name, nice)
                })
                .await
                .expect("task")
        });
        assert_eq!(name.as_deref(), Some("gpuwatch-query"));
        assert_eq!(nice, QUERY_NICE);
        runtime.shutdown_background();
    }
}
