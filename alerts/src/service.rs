//! The running alerting service: rule groups evaluated on their intervals, the notifier ticked
//! every second, one delivery worker per receiver. Evaluation only appends to queues, so a slow
//! receiver never delays it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuwatch_store::clock::Clock;
use tokio::sync::watch;

use crate::engine::{Alert, RuleEngine};
use crate::error::{Error, Result};
use crate::history::History;
use crate::notify::{AlertingConfig, Dispatcher, Outbox, Silence, Silences};
use crate::rules::RuleFile;
use crate::source::RuleSource;

/// Rules, notifier and delivery together.
pub struct Alerting {
    /// State files found damaged at start and moved to quarantine (alerting started without
    /// them).
    quarantined: Vec<PathBuf>,
    engine: RuleEngine,
    notifier: Mutex<(Dispatcher, Silences)>,
    outbox: Outbox,
    clock: Arc<dyn Clock>,
    ledger: std::sync::OnceLock<Arc<crate::cost::JobLedger>>,
}

impl std::fmt::Debug for Alerting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Alerting")
            .field("outbox", &self.outbox)
            .finish()
    }
}

impl Alerting {
    /// Opens the service; with `dir` (e.g. `<data-dir>/alerts`), state, history, silences and
    /// queued notifications are kept there and resumed. A state file that cannot be read
    /// (`state.json`, `silences.json`, `notify.json`) never keeps alerting — or the server —
    /// from starting: it moves to `<data-dir>/quarantine/` with a note, loudly, and alerting
    /// starts without it (alerts that were firing fire again, silences must be made again).
    pub fn open(
        rules: RuleFile,
        config: AlertingConfig,
        dir: Option<&Path>,
        clock: Arc<dyn Clock>,
        store: Option<Arc<gpuwatch_store::Store>>,
    ) -> Result<Self> {
        let mut quarantined = Vec::new();
        loop {
            let opened = Self::open_once(
                rules.clone(),
                config.clone(),
                dir,
                Arc::clone(&clock),
                store.clone(),
            );
            match (opened, dir) {
                (Err(Error::Corrupt { path, source }), Some(d))
                    if quarantined.len() < 8 && path.starts_with(d) =>
                {
                    let problem = source.to_string();
                    let moved = crate::state::set_aside(d, &path, &problem, clock.as_ref())?;
                    quarantined.push(moved);
                }
                (Ok(mut a), _) => {
                    a.quarantined = quarantined;
                    return Ok(a);
                }
                (Err(e), _) => return Err(e),
            }
        }
    }

    /// State files found damaged at start and moved to quarantine.
    pub fn quarantined(&self) -> &[PathBuf] {
        &self.quarantined
    }

    fn open_once(
        rules: RuleFile,
        config: AlertingConfig,
        dir: Option<&Path>,
        clock: Arc<dyn Clock>,
        store: Option<Arc<gpuwatch_store::Store>>,
    ) -> Result<Self> {
        if let Some(d) = dir {
            std::fs::create_dir_all(d).map_err(|source| Error::Io {
                what: "cannot create the alerting directory",
                path: d.to_path_buf(),
                source,
            })?;
        }
        let history = match store {
            Some(store) => {
                History::in_store(store, dir.map(|d| d.join("history.jsonl")).as_deref())?
            }
            None => History::in_memory(),
        };
        let engine = RuleEngine::new(
            rules,
            Arc::clone(&clock),
            dir.map(|d| d.join("state.json")),
            history,
        )?;
        let external = config.external_url.clone().unwrap_or_default();
        let outbox = Outbox::open(
            &config.receivers,
            dir.map(|d| d.join("queue")).as_deref(),
            &external,
        )?;
        let dispatcher = Dispatcher::new(config, dir.map(|d| d.join("notify.json")))?;
        let silences = Silences::open(dir.map(|d| d.join("silences.json")))?;
        Ok(Self {
            quarantined: Vec::new(),
            engine,
            notifier: Mutex::new((dispatcher, silences)),
            outbox,
            clock,
            ledger: std::sync::OnceLock::new(),
        })
    }

    /// Attaches the job-usage ledger, so `/metrics` shows how far it has folded.
    pub fn set_ledger(&self, ledger: Arc<crate::cost::JobLedger>) {
        let _ = self.ledger.set(ledger);
    }

    /// The job-usage ledger, once attached.
    pub fn ledger(&self) -> Option<&Arc<crate::cost::JobLedger>> {
        self.ledger.get()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Dispatcher, Silences)> {
        self.notifier.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The rule engine.
    pub fn engine(&self) -> &RuleEngine {
        &self.engine
    }

    /// The delivery queues.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Evaluates group `group` now and hands the alerts to the notifier.
    pub async fn evaluate_group(&self, group: usize, source: &dyn RuleSource) -> Result<()> {
        self.engine.evaluate_group(group, source).await?;
        let alerts = self.engine.alerts();
        let now = self.clock.now_nanos();
        self.lock().0.ingest(&alerts, now)
    }

    /// Evaluates every group now.
    pub async fn evaluate_all(&self, source: &dyn RuleSource) -> Result<()> {
        for g in 0..self.engine.rules().groups.len() {
            self.evaluate_group(g, source).await?;
        }
        Ok(())
    }

    /// Queues the notifications due now; returns how many.
    pub fn tick(&self) -> Result<usize> {
        let now = self.clock.now_nanos();
        let due = {
            let mut g = self.lock();
            let (d, s) = &mut *g;
            d.tick(now, s)?
        };
        for (receiver, message) in &due {
            self.outbox.enqueue(receiver, message)?;
        }
        Ok(due.len())
    }

    /// Active alerts (pending, firing, recently resolved).
    pub fn alerts(&self) -> Vec<Alert> {
        self.engine.alerts()
    }

    /// Whether an alert is silenced now.
    pub fn silenced(&self, a: &Alert) -> bool {
        self.lock().1.silenced(&a.labels, self.clock.now_nanos())
    }

    /// Every silence.
    pub fn silences(&self) -> Vec<Silence> {
        self.lock().1.list().to_vec()
    }

    /// Adds a silence; returns its id.
    pub fn add_silence(&self, s: Silence) -> Result<String> {
        let now = self.clock.now_nanos();
        self.lock().1.add(s, now)
    }

    /// Expires a silence; false if unknown.
    pub fn expire_silence(&self, id: &str) -> Result<bool> {
        let now = self.clock.now_nanos();
        self.lock().1.expire(id, now)
    }

    /// The clock.
    pub fn now(&self) -> i64 {
        self.clock.now_nanos()
    }

    /// Starts the evaluation loops, the notifier tick and the delivery workers.
    pub fn start(
        self: &Arc<Self>,
        source: Arc<dyn RuleSource>,
        stop: watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = self.outbox.start(stop.clone());
        for (i, g) in self.engine.rules().groups.iter().enumerate() {
            let me = Arc::clone(self);
            let src = Arc::clone(&source);
            let mut stop = stop.clone();
            let every = g.interval.0;
            let name = g.name.clone();
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = stop.changed() => return,
                    }
                    if let Err(e) = me.evaluate_group(i, src.as_ref()).await {
                        tracing::error!(group = %name, error = %e, "rule group evaluation failed");
                    }
                }
            }));
        }
        let me = Arc::clone(self);
        let mut stop2 = stop;
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop2.changed() => return,
                }
                if let Err(e) = me.tick() {
                    tracing::error!(error = %e, "notifier tick failed");
                }
            }
        }));
        tasks
    }
}
