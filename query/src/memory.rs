//! One memory ceiling for the process (`--memory-limit`).
//!
//! The ceiling is shared out once, at start:
//! - queries: one DataFusion memory pool of [`QUERY_SHARE`] of the limit, shared by every query
//!   (HTTP, Postgres, alert rules); each query also keeps to its own `--query-memory-limit`
//!   inside it ([`Ceiling::query_pool`]). Sorts, joins and aggregations spill or fail with 503 /
//!   `53200` when either is full.
//! - the ingest buffer: at most [`BUFFER_SHARE`] of the limit (`--max-buffer-bytes` is lowered
//!   to it); writes get 503 + Retry-After when it is full, as before.
//! - decoding writes: at most [`DECODE_SHARE`] of the limit, reserved before a body is
//!   inflated or decoded ([`Ceiling::reserve_decode`]): [`DECODE_FACTOR`] bytes per inflated
//!   byte, asked for step by step while a gzip body is inflated, so a decode bomb is refused
//!   before it is built (503 + Retry-After while others hold the room; 413 when the request
//!   alone needs more than the whole share).
//! - the Parquet metadata cache (the footers and page indexes of the files queries read, kept
//!   between queries): [`METADATA_SHARE`] of the limit, at least DataFusion's own 50 MiB
//!   ([`metadata_cache_bytes`]). A year of 10,000 GPUs is some 2,000 rollup and ledger files
//!   whose footers alone are over 100 MB: a smaller cache reads a year's daily footers again at
//!   every question (0.2–0.4 s of a year-long panel).
//! - the rest (a fortieth) is headroom for WAL replay, persistence, compaction and answers
//!   being encoded.
//!
//! What no pool counts (a value a function builds, a batch being encoded) is watched through the
//! process's resident memory, read every [`WATCH_EVERY`]: at [`STOP_AT`] of the limit running
//! queries are stopped and, while the server holds accounted work (decode reservations or query
//! pool reservations), new ones are refused (503, `53200`) until it is back under
//! [`RESUME_AT`]; at [`INGEST_STOP_AT`] writes are refused with 503 + Retry-After too. Over the
//! stop mark the allocator is asked to return freed memory to the system (glibc
//! `malloc_trim`), at most once per [`TRIM_EVERY`], so heap kept after a burst does not read as
//! pressure; and a server holding no accounted work never refuses on resident memory alone.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::{
    GreedyMemoryPool, MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
    TrackConsumersPool,
};
use tokio::sync::watch;

/// Share of the limit for the queries' memory pool.
pub const QUERY_SHARE: f64 = 0.5;
/// Share of the limit the ingest buffer may hold.
pub const BUFFER_SHARE: f64 = 0.25;
/// Share of the limit that decodes in flight may reserve together.
pub const DECODE_SHARE: f64 = 0.2;
/// Bytes reserved per inflated byte of a write: the inflated body and the messages and rows
/// decoding it builds (an estimated bound, not measured per kind of body).
pub const DECODE_FACTOR: usize = 24;
/// Share of the limit the Parquet metadata cache may hold.
pub const METADATA_SHARE: f64 = 0.025;
/// The smallest metadata cache under a ceiling (DataFusion's own default).
pub const METADATA_CACHE_MIN: usize = 50 << 20;
/// The metadata cache of a process without a memory ceiling (`--memory-limit 0`).
pub const METADATA_CACHE_UNBOUNDED: usize = 512 << 20;
/// Least time between two requests to the allocator to return freed memory.
pub const TRIM_EVERY: Duration = Duration::from_secs(1);
/// Resident memory, as a share of the limit, at which queries are refused and stopped.
pub const STOP_AT: f64 = 0.85;
/// Resident memory, as a share of the limit, under which queries run again.
pub const RESUME_AT: f64 = 0.75;
/// Resident memory, as a share of the limit, at which writes are refused.
pub const INGEST_STOP_AT: f64 = 0.95;
/// How often resident memory is read.
pub const WATCH_EVERY: Duration = Duration::from_millis(50);
/// Share of the machine's (or cgroup's) memory `--memory-limit` defaults to.
pub const DEFAULT_SHARE: f64 = 0.6;

/// The size of the Parquet metadata cache under `ceiling`: [`METADATA_SHARE`] of its limit, at
/// least [`METADATA_CACHE_MIN`]; [`METADATA_CACHE_UNBOUNDED`] without one.
pub fn metadata_cache_bytes(ceiling: Option<&Ceiling>) -> usize {
    ceiling.map_or(METADATA_CACHE_UNBOUNDED, |c| {
        ((c.limit() as f64 * METADATA_SHARE) as usize).max(METADATA_CACHE_MIN)
    })
}

/// The default `--memory-limit`: [`DEFAULT_SHARE`] of the machine's memory or of the cgroup's
/// limit, whichever is lower; `None` when neither can be read.
pub fn default_limit() -> Option<usize> {
    let machine = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| kib_field(&t, "MemTotal:"));
    let cgroup = cgroup_limit();
    let total = match (machine, cgroup) {
        (Some(m), Some(c)) => m.min(c),
        (m, c) => m.or(c)?,
    };
    Some((total as f64 * DEFAULT_SHARE) as usize)
}

/// The memory limit of the process's cgroup (v2 `memory.max`, or v1's), if it has one.
fn cgroup_limit() -> Option<usize> {
    for path in [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ] {
        if let Ok(text) = std::fs::read_to_string(path) {
            let text = text.trim();
            if text == "max" {
                return None;
            }
            // v1 says "no limit" with a huge number.
            return text
                .parse::<u64>()
                .ok()
                .filter(|n| *n < (1 << 60))
                .map(|n| n as usize);
        }
    }
    None
}

/// A `Name:   123 kB` field of a /proc file, in bytes.
fn kib_field(text: &str, name: &str) -> Option<usize> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kib: usize = line[name.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib.saturating_mul(1024))
}

/// The process's resident memory now and at its peak (`VmRSS`, `VmHWM`), in bytes.
pub fn resident() -> Option<(usize, usize)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    Some((
        kib_field(&status, "VmRSS:")?,
        kib_field(&status, "VmHWM:").unwrap_or(0),
    ))
}

/// A query refused or stopped because the process is near its ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pressure {
    /// Resident memory when it was decided, in bytes.
    pub used: usize,
    /// `--memory-limit`, in bytes.
    pub limit: usize,
}

impl fmt::Display for Pressure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the server is near its --memory-limit ({} bytes in use of {})",
            self.used, self.limit
        )
    }
}

impl std::error::Error for Pressure {}

impl Pressure {
    /// The [`Pressure`] at the root of `e`, if that is what it is.
    pub fn find(e: &DataFusionError) -> Option<Pressure> {
        match e.find_root() {
            DataFusionError::External(inner) => inner.downcast_ref::<Pressure>().copied(),
            _ => None,
        }
    }

    /// As a DataFusion error.
    pub fn into_datafusion(self) -> DataFusionError {
        DataFusionError::External(Box::new(self))
    }
}

/// The process's memory ceiling.
pub struct Ceiling {
    limit: usize,
    pool: Arc<dyn MemoryPool>,
    rss: AtomicUsize,
    peak: AtomicUsize,
    pressure: AtomicBool,
    stops: watch::Sender<u64>,
    queries_stopped: AtomicU64,
    queries_refused: AtomicU64,
    writes_refused: AtomicU64,
    decoding: AtomicUsize,
    decodes_refused: AtomicU64,
}

impl fmt::Debug for Ceiling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ceiling")
            .field("limit", &self.limit)
            .field("rss", &self.rss.load(Ordering::Relaxed))
            .field("pressure", &self.pressure.load(Ordering::Relaxed))
            .finish()
    }
}

impl Ceiling {
    /// A ceiling of `limit` bytes. Resident memory is read only by [`Ceiling::watch`] (or
    /// [`Ceiling::observe`] in tests).
    pub fn new(limit: usize) -> Arc<Self> {
        let share = (limit as f64 * QUERY_SHARE) as usize;
        Arc::new(Self {
            limit,
            pool: Arc::new(GreedyMemoryPool::new(share)),
            rss: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            pressure: AtomicBool::new(false),
            stops: watch::channel(0).0,
            queries_stopped: AtomicU64::new(0),
            queries_refused: AtomicU64::new(0),
            writes_refused: AtomicU64::new(0),
            decoding: AtomicUsize::new(0),
            decodes_refused: AtomicU64::new(0),
        })
    }

    /// `--memory-limit`, in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The bytes the ingest buffer may hold: [`BUFFER_SHARE`] of the limit.
    pub fn buffer_bytes(&self) -> usize {
        (self.limit as f64 * BUFFER_SHARE) as usize
    }

    /// The bytes all queries together may reserve.
    pub fn query_bytes(&self) -> usize {
        (self.limit as f64 * QUERY_SHARE) as usize
    }

    /// Reads resident memory every [`WATCH_EVERY`] on a thread of its own, for the life of the
    /// process.
    pub fn watch(self: &Arc<Self>) -> std::io::Result<()> {
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name("gpuwatch-memory".into())
            .spawn(move || {
                let mut trimmed = std::time::Instant::now();
                loop {
                    if let Some((mut rss, peak)) = resident() {
                        let over = rss >= (me.limit as f64 * STOP_AT) as usize;
                        if over && trimmed.elapsed() >= TRIM_EVERY {
                            trimmed = std::time::Instant::now();
                            return_freed_memory();
                            rss = resident().map_or(rss, |(now, _)| now);
                        }
                        me.observe(rss, peak);
                    }
                    std::thread::sleep(WATCH_EVERY);
                }
            })
            .map(|_| ())
    }

    /// Takes a reading of resident memory (`rss`, and the process's peak `peak`), in bytes.
    pub fn observe(&self, rss: usize, peak: usize) {
        self.rss.store(rss, Ordering::Relaxed);
        self.peak.fetch_max(peak.max(rss), Ordering::Relaxed);
        let stop = (self.limit as f64 * STOP_AT) as usize;
        let resume = (self.limit as f64 * RESUME_AT) as usize;
        let under = self.pressure.load(Ordering::Relaxed);
        if !under && rss >= stop {
            self.pressure.store(true, Ordering::Relaxed);
            tracing::warn!(
                rss,
                limit = self.limit,
                "resident memory near --memory-limit: running queries stopped, new ones refused"
            );
            self.stops.send_modify(|n| *n += 1);
        } else if under && rss < resume {
            self.pressure.store(false, Ordering::Relaxed);
            tracing::info!(
                rss,
                limit = self.limit,
                "resident memory back under the resume mark"
            );
        } else if under && rss >= stop {
            // Still over: whatever started since is stopped too.
            self.stops.send_modify(|n| *n += 1);
        }
    }

    /// True while the server holds work it accounts for: decode reservations or query pool
    /// reservations. Without it, resident memory over the marks is heap the allocator kept,
    /// and nothing is refused for it.
    fn busy(&self) -> bool {
        self.decoding.load(Ordering::Acquire) > 0 || self.pool.reserved() > 0
    }

    /// `Err` when queries may not start now.
    pub fn admit_query(&self) -> Result<(), Pressure> {
        if self.pressure.load(Ordering::Relaxed) && self.busy() {
            self.queries_refused.fetch_add(1, Ordering::Relaxed);
            return Err(self.pressure_now());
        }
        Ok(())
    }

    /// `Err` when writes must be refused now (resident memory at [`INGEST_STOP_AT`]).
    pub fn admit_write(&self) -> Result<(), Pressure> {
        let rss = self.rss.load(Ordering::Relaxed);
        if rss >= (self.limit as f64 * INGEST_STOP_AT) as usize && self.busy() {
            self.writes_refused.fetch_add(1, Ordering::Relaxed);
            return Err(self.pressure_now());
        }
        Ok(())
    }

    fn pressure_now(&self) -> Pressure {
        Pressure {
            used: self.rss.load(Ordering::Relaxed),
            limit: self.limit,
        }
    }

    /// The bytes all decodes in flight may reserve: [`DECODE_SHARE`] of the limit.
    pub fn decode_bytes(&self) -> usize {
        (self.limit as f64 * DECODE_SHARE) as usize
    }

    /// An empty reservation for one write's decode; it grows with
    /// [`DecodeReservation::inflated`] and is given back when dropped.
    pub fn reserve_decode(self: &Arc<Self>) -> DecodeReservation {
        DecodeReservation {
            ceiling: Arc::clone(self),
            bytes: 0,
        }
    }

    /// Changes each time running queries must stop.
    pub fn stops(&self) -> watch::Receiver<u64> {
        self.stops.subscribe()
    }

    /// The error a stopped query ends with (and counts it).
    pub fn stopped(&self) -> DataFusionError {
        self.queries_stopped.fetch_add(1, Ordering::Relaxed);
        self.pressure_now().into_datafusion()
    }

    /// A memory pool for one query: `per_query` bytes of its own at most (`None`: no limit of
    /// its own), inside the pool all queries share.
    pub fn query_pool(&self, per_query: Option<usize>) -> Arc<dyn MemoryPool> {
        Arc::new(QueryPool {
            shared: Arc::clone(&self.pool),
            limit: per_query.unwrap_or(usize::MAX),
            used: AtomicUsize::new(0),
        })
    }

    /// Figures for `/metrics`.
    pub fn stats(&self) -> CeilingStats {
        CeilingStats {
            limit: self.limit,
            resident: self.rss.load(Ordering::Relaxed),
            peak: self.peak.load(Ordering::Relaxed),
            query_reserved: self.pool.reserved(),
            pressure: self.pressure.load(Ordering::Relaxed),
            queries_stopped: self.queries_stopped.load(Ordering::Relaxed),
            queries_refused: self.queries_refused.load(Ordering::Relaxed),
            writes_refused: self.writes_refused.load(Ordering::Relaxed),
            decode_reserved: self.decoding.load(Ordering::Relaxed),
            decodes_refused: self.decodes_refused.load(Ordering::Relaxed),
        }
    }
}

/// Asks the allocator to give freed heap back to the system (glibc keeps it otherwise, and it
/// would read as resident memory in use).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn return_freed_memory() {
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn return_freed_memory() {}

/// Memory reserved for one write's decode (see [`Ceiling::reserve_decode`]).
#[derive(Debug)]
pub struct DecodeReservation {
    ceiling: Arc<Ceiling>,
    bytes: usize,
}

impl DecodeReservation {
    /// Reserves room for `inflated` more inflated bytes ([`DECODE_FACTOR`] bytes each), before
    /// they are inflated.
    pub fn inflated(&mut self, inflated: usize) -> Result<(), DecodeRefused> {
        let more = inflated.saturating_mul(DECODE_FACTOR);
        let share = self.ceiling.decode_bytes();
        let wanted = self.bytes.saturating_add(more);
        let taken =
            self.ceiling
                .decoding
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                    let next = held.checked_add(more)?;
                    (next <= share).then_some(next)
                });
        match taken {
            Ok(_) => {
                self.bytes = wanted;
                Ok(())
            }
            Err(held) => {
                self.ceiling.decodes_refused.fetch_add(1, Ordering::Relaxed);
                Err(DecodeRefused {
                    needed: wanted,
                    held: held.saturating_sub(self.bytes),
                    share,
                    limit: self.ceiling.limit,
                })
            }
        }
    }

    /// The bytes reserved.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DecodeReservation {
    fn drop(&mut self) {
        self.ceiling
            .decoding
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A write whose decode the ceiling cannot make room for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeRefused {
    /// Bytes the request needed so far (inflated bytes times [`DECODE_FACTOR`]).
    pub needed: usize,
    /// Bytes other decodes held.
    pub held: usize,
    /// The decode share of the limit.
    pub share: usize,
    /// `--memory-limit`.
    pub limit: usize,
}

impl DecodeRefused {
    /// True when the request alone needs more than the whole decode share: it never fits,
    /// and retrying it is pointless (413); otherwise it fits once others finish (503).
    pub fn never_fits(&self) -> bool {
        self.needed > self.share
    }
}

impl fmt::Display for DecodeRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.never_fits() {
            write!(
                f,
                "the request needs more than the {} bytes --memory-limit ({}) leaves for decoding writes: split the batch into smaller requests",
                self.share, self.limit
            )
        } else {
            write!(
                f,
                "the server is decoding other writes ({} of the {} bytes --memory-limit leaves for decoding in use): write not stored, retry after the Retry-After delay",
                self.held, self.share
            )
        }
    }
}

impl std::error::Error for DecodeRefused {}

/// What the ceiling has seen, for `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CeilingStats {
    /// `--memory-limit`.
    pub limit: usize,
    /// Resident memory at the last reading.
    pub resident: usize,
    /// The process's peak resident memory.
    pub peak: usize,
    /// Bytes reserved by running queries in the shared pool.
    pub query_reserved: usize,
    /// Whether queries are refused now.
    pub pressure: bool,
    /// Queries stopped because of resident memory.
    pub queries_stopped: u64,
    /// Queries refused because of resident memory.
    pub queries_refused: u64,
    /// Writes refused because of resident memory.
    pub writes_refused: u64,
    /// Bytes reserved by decodes in flight.
    pub decode_reserved: usize,
    /// Writes refused because their decode found no room.
    pub decodes_refused: u64,
}

/// One query's pool: its own limit inside the shared pool.
#[derive(Debug)]
struct QueryPool {
    shared: Arc<dyn MemoryPool>,
    limit: usize,
    used: AtomicUsize,
}

impl fmt::Display for QueryPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "query pool of {} bytes in {}", self.limit, self.shared)
    }
}

impl MemoryPool for QueryPool {
    fn name(&self) -> &str {
        "query"
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.shared.register(consumer)
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.shared.unregister(consumer)
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.shared.grow(reservation, additional);
        self.used.fetch_add(additional, Ordering::Relaxed);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.shared.shrink(reservation, shrink);
        self.used.fetch_sub(shrink, Ordering::Relaxed);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DfResult<()> {
        let used = self.used.load(Ordering::Relaxed);
        if used.saturating_add(additional) > self.limit {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "failed to allocate additional {additional} bytes for {} with {used} bytes already allocated for this query - the query's limit is {} bytes",
                reservation.consumer().name(),
                self.limit
            )));
        }
        self.shared.try_grow(reservation, additional)?;
        self.used.fetch_add(additional, Ordering::Relaxed);
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit.min(match self.shared.memory_limit() {
            MemoryLimit::Finite(n) => n,
            _ => usize::MAX,
        }))
    }
}

/// A pool of `limit` bytes for one query, without a ceiling (as `--query-memory-limit` alone).
pub fn standalone_pool(limit: usize) -> Arc<dyn MemoryPool> {
    Arc::new(TrackConsumersPool::new(
        GreedyMemoryPool::new(limit),
        std::num::NonZeroUsize::new(5).unwrap_or(std::num::NonZeroUsize::MIN),
    ))
}

#[cfg(test)]
mod tests;
