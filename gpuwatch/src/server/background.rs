//! The server's background work: the store opened (WAL replayed) off the async threads, the
//! query engine and alerting built over it, then the loops: persist (servers that ingest),
//! periodic WAL fsync (`--wal-sync interval`), maintenance (`--maintenance on`) and refresh of
//! the tables (every server: other servers' commits become visible).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::server::sql::EngineSlot;
use gpuwatch_common::metrics::prometheus_client::metrics::histogram::Histogram;
use gpuwatch_query::{EngineConfig, QueryEngine};
use gpuwatch_store::clock::Clock;
use gpuwatch_store::{ReadStore, Store, StoreConfig};
use tokio::sync::watch;

use super::App;
use crate::config::{Role, ServeConfig, WalSync};

/// Everything the background work needs.
pub(super) struct Background {
    pub store_slot: Arc<OnceLock<Arc<Store>>>,
    pub engine_slot: EngineSlot,
    pub alerts_slot: crate::alerts_wiring::AlertingSlot,
    pub store_config: StoreConfig,
    pub engine_config: EngineConfig,
    pub clock: Arc<dyn Clock>,
    pub rules: gpuwatch_alerts::RuleFile,
    pub alerts: crate::alerts_wiring::AlertsConfig,
    pub data_dir: PathBuf,
    pub ingest: bool,
    pub persist_every: Duration,
    pub sync_every: Option<Duration>,
    pub maintain_every: Option<Duration>,
    pub refresh_every: Duration,
    pub persist_seconds: Histogram,
    pub stop: watch::Receiver<bool>,
}

impl Background {
    /// The background work of a server run with `config`, filling the slots of `app`.
    pub(super) fn new(
        config: &ServeConfig,
        app: &App,
        clock: Arc<dyn Clock>,
        rules: gpuwatch_alerts::RuleFile,
        stop: watch::Receiver<bool>,
    ) -> Self {
        let storage = &config.settings.storage;
        Background {
            store_slot: Arc::clone(&app.store),
            engine_slot: Arc::clone(&app.engine),
            alerts_slot: Arc::clone(&app.alerting),
            store_config: config.store_config(app.ceiling.as_deref()),
            engine_config: config.engine_config(app.ceiling.clone()),
            clock,
            rules,
            alerts: config.alerts.clone(),
            data_dir: config.data_dir.clone(),
            ingest: config.settings.role.role != Role::Query,
            persist_every: config.persist_interval,
            sync_every: (storage.wal_sync == WalSync::Interval)
                .then_some(storage.wal_sync_interval.get()),
            maintain_every: config
                .maintenance
                .then_some(storage.compaction_interval.get()),
            refresh_every: storage.refresh_interval.get(),
            persist_seconds: app.metrics.persist_seconds.clone(),
            stop,
        }
    }
}

/// The longest wait between two attempts to open the store.
const MAX_OPEN_BACKOFF: Duration = Duration::from_secs(30);

/// Opens the store, retrying with backoff (1 s, doubling, at most 30 s) until it opens or the
/// server stops: a store that cannot open now (a full disk, an object store out of reach)
/// opens by itself once the cause is gone. `/readyz` says why meanwhile.
async fn open_store(b: &Background) -> Option<Arc<Store>> {
    let mut stop = b.stop.clone();
    let mut wait = Duration::from_secs(1);
    for attempt in 1u64.. {
        let clock = Arc::clone(&b.clock);
        let config = b.store_config.clone();
        let error = match tokio::task::spawn_blocking(move || Store::open(config, clock)).await {
            Ok(Ok(s)) => return Some(Arc::new(s)),
            Ok(Err(e)) => {
                let hint = if e.is_disk_full() {
                    " (free space where the data directory is)"
                } else {
                    ""
                };
                format!("{e}{hint}")
            }
            Err(e) => format!("the open task failed: {e}"),
        };
        tracing::error!(attempt, retry_in = ?wait, error = %error, "cannot open the store; retrying");
        gpuwatch_store::startup::set(format!(
            "cannot open the store (attempt {attempt}): {error}; retrying in {} s",
            wait.as_secs()
        ));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return None,
        }
        wait = (wait * 2).min(MAX_OPEN_BACKOFF);
    }
    None
}

/// Opens the store, builds the engine and alerting, then runs the loops until `stop`.
pub(super) async fn run(b: Background) {
    let Some(store) = open_store(&b).await else {
        return;
    };
    let read: Arc<dyn ReadStore> = Arc::clone(&store) as Arc<dyn ReadStore>;
    let query_timeout = b.engine_config.query_timeout;
    let engine = match QueryEngine::new(read, b.engine_config) {
        Ok(engine) => engine,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the query engine");
            gpuwatch_store::startup::set(format!(
                "the query engine cannot be built ({e}): the server stays unready"
            ));
            return;
        }
    };
    match crate::alerts_wiring::start(
        &engine,
        b.rules,
        &b.alerts,
        crate::alerts_wiring::Placement {
            store: Arc::clone(&store),
            ingest: b.ingest,
            maintain: b.maintain_every.is_some(),
            data_dir: b.data_dir.as_path(),
        },
        Arc::clone(&b.clock),
        query_timeout,
        b.stop.clone(),
    )
    .await
    {
        Ok((alerting, _tasks)) => {
            let _ = b.alerts_slot.set(alerting);
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot start alerting; the server stays unready");
            gpuwatch_store::startup::set(format!(
                "the store is open but alerting cannot start ({e}): fix the cause and restart the server"
            ));
            return;
        }
    }
    let _ = b.engine_slot.set(engine);
    let _ = b.store_slot.set(Arc::clone(&store));
    tracing::info!(
        ingest = b.ingest,
        maintenance = b.maintain_every.is_some(),
        "ready: accepting {}",
        if b.ingest {
            "writes and queries"
        } else {
            "queries (a query node: no writes)"
        }
    );
    spawn_loops(
        &store,
        b.sync_every,
        b.maintain_every,
        b.refresh_every,
        &b.stop,
    );
    if !b.ingest {
        return;
    }
    persist_loop(&store, b.persist_every, &b.persist_seconds, b.stop).await;
}

/// Persists every `every`, and early when the buffer is half full, until `stop`.
async fn persist_loop(
    store: &Arc<Store>,
    every: Duration,
    seconds: &Histogram,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => persist(store, seconds).await,
            _ = store.persist_wanted().notified() => {
                tracing::info!("write buffer at half its cap: persisting early");
                persist(store, seconds).await;
            }
            _ = stop.changed() => break,
        }
    }
}

/// The periodic WAL fsync (`--wal-sync interval`), maintenance (`--maintenance on`) and the
/// tables' refresh, each on a blocking thread.
fn spawn_loops(
    store: &Arc<Store>,
    sync_every: Option<Duration>,
    maintain_every: Option<Duration>,
    refresh_every: Duration,
    stop: &watch::Receiver<bool>,
) {
    if let Some(every) = sync_every {
        spawn_every(store, every, stop.clone(), "wal_sync", |s| {
            if let Err(e) = s.sync_wal() {
                tracing::error!(error = %e, "periodic write-ahead log fsync failed");
            }
        });
    }
    if let Some(every) = maintain_every {
        spawn_every(
            store,
            every,
            stop.clone(),
            "compaction",
            |s| match tracing::info_span!("compaction").in_scope(|| s.maintain()) {
                Ok(r) if r != gpuwatch_store::MaintenanceReport::default() => {
                    tracing::info!(
                        windows = r.windows_compacted,
                        merged = r.files_merged,
                        rollups = r.rollup_files,
                        expired = r.files_expired,
                        deleted = r.files_deleted,
                        "compaction, retention and vacuum"
                    );
                }
                Ok(_) => {}
                Err(e @ gpuwatch_store::Error::DeltaConflict { .. }) => tracing::warn!(
                    "maintenance met another maintainer's commit (only one server should run --maintenance on): nothing written, retried at the next interval: {e}"
                ),
                Err(e) => {
                    tracing::error!(error = %e, "maintenance failed; retried at the next interval")
                }
            },
        );
    }
    spawn_every(store, refresh_every, stop.clone(), "refresh", |s| {
        if let Err(e) = tracing::info_span!("refresh").in_scope(|| s.refresh()) {
            tracing::warn!(error = %e, "could not read the tables' logs; retried at the next interval");
        }
    });
}

/// Runs `work` on a blocking thread every `every`, the first time after one interval.
fn spawn_every(
    store: &Arc<Store>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
    span: &'static str,
    work: impl Fn(&Store) + Send + Sync + Copy + 'static,
) {
    let store = Arc::clone(store);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let s = Arc::clone(&store);
            let done = tokio::task::spawn_blocking(move || work(&s)).await;
            if let Err(e) = done {
                tracing::error!(error = %e, task = span, "background task failed");
            }
        }
    });
}

/// One persist, logged.
pub(super) async fn persist(store: &Arc<Store>, seconds: &Histogram) {
    let s = Arc::clone(store);
    let started = std::time::Instant::now();
    let done = tokio::task::spawn_blocking(move || {
        tracing::info_span!("persist").in_scope(|| s.persist())
    })
    .await;
    seconds.observe(started.elapsed().as_secs_f64());
    match done {
        Ok(Ok(Some(r))) => tracing::info!(
            files = r.files.len(),
            rows = r.rows,
            wal_through = r.wal_persisted_through,
            "persisted"
        ),
        Ok(Ok(None)) => {}
        Ok(Err(e)) => {
            tracing::error!(error = %e, "persist failed; the data stays in the write-ahead log and is retried")
        }
        Err(e) => tracing::error!(error = %e, "persist task failed"),
    }
}
