//! The server's background work: the store opened (WAL replayed) off the async threads, the
//! query engine and alerting built over it, then the loops: persist (servers that ingest),
//! periodic WAL fsync (`--wal-sync interval`), maintenance (`--maintenance on`) and refresh of
//! the tables (every server: other servers' commits become visible).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use gpuwatch_query::http::EngineSlot;
use gpuwatch_query::{EngineConfig, QueryEngine};
use gpuwatch_store::clock::Clock;
use gpuwatch_store::{ReadStore, Store, StoreConfig};
use tokio::sync::watch;

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
    pub stop: watch::Receiver<bool>,
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
    let history_store = b.ingest.then(|| Arc::clone(&store));
    match crate::alerts_wiring::start(
        &engine,
        b.rules,
        &b.alerts,
        // A query node keeps alerting state in memory only (it runs no rules): the data
        // directory may be another server's.
        b.ingest.then_some(b.data_dir.as_path()),
        history_store,
        b.clock,
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
    if let Some(every) = b.sync_every {
        spawn_every(&store, every, b.stop.clone(), "wal_sync", |s| {
            if let Err(e) = s.sync_wal() {
                tracing::error!(error = %e, "periodic write-ahead log fsync failed");
            }
        });
    }
    if let Some(every) = b.maintain_every {
        spawn_every(
            &store,
            every,
            b.stop.clone(),
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
    spawn_every(&store, b.refresh_every, b.stop.clone(), "refresh", |s| {
        if let Err(e) = tracing::info_span!("refresh").in_scope(|| s.refresh()) {
            tracing::warn!(error = %e, "could not read the tables' logs; retried at the next interval");
        }
    });
    if !b.ingest {
        return;
    }
    let mut stop = b.stop;
    let mut tick = tokio::time::interval(b.persist_every);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => persist(&store).await,
            _ = store.persist_wanted().notified() => {
                tracing::info!("write buffer at half its cap: persisting early");
                persist(&store).await;
            }
            _ = stop.changed() => break,
        }
    }
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
pub(super) async fn persist(store: &Arc<Store>) {
    let s = Arc::clone(store);
    match tokio::task::spawn_blocking(move || {
        tracing::info_span!("persist").in_scope(|| s.persist())
    })
    .await
    {
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
