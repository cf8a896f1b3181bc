//! When the ledger folds, and what it knows of the `job_ledger` table between folds.
//!
//! At start (and whenever the oldest raw sample's hour moves) the ledger reads the table: the
//! hour rows from that hour on give the folded hours, the watermark is where they stop being
//! contiguous (hours after a gap are folded again), and the GPU rows before it give the seed.
//! Hours older than the raw samples are final: they are read, never folded again. The server
//! that folds (it ingests and runs maintenance) then folds each hour as it closes, and refolds
//! from the first hour whose sample count no longer matches its `gpu_metrics_1h` rollup; every
//! other server (a query node) reads the table again when its files change.

use std::sync::Arc;

use arrow::array::Int64Array;
use arrow::datatypes::Int64Type;
use gpuwatch_store::Store;
use gpuwatch_store::clock::Clock;
use gpuwatch_store::schema::Table;
use tokio::sync::watch;

use super::*;

/// The files of the table and of its daily sums, by path.
fn table_files(store: &Store) -> Vec<String> {
    [
        Table::JobLedger,
        Table::JobLedger1d,
        Table::JobLedgerTotals,
        Table::JobLedgerSpend,
    ]
    .iter()
    .flat_map(|t| {
        store
            .files(*t)
            .iter()
            .map(|f| f.path.clone())
            .collect::<Vec<_>>()
    })
    .collect()
}

/// The end of the last hour the table holds.
fn table_end(store: &Store) -> Option<i64> {
    store
        .files(Table::JobLedger)
        .iter()
        .filter(|f| f.has_time_range())
        .map(|f| floor_hour(f.max_time) + HOUR)
        .max()
}

impl JobLedger {
    /// One pass. Reads the table when needed (first pass, a moved oldest raw hour, or — on a
    /// server that does not `fold` — changed files); then, when `fold`, refolds hours that
    /// received late samples and folds the hours closed since the last pass, writing each to
    /// the table through `store`, and writes the sums of the days whose hours are all folded
    /// ([`days`]). Returns the hours folded.
    pub async fn step(
        &self,
        ctx: &SessionContext,
        store: &Arc<Store>,
        fold: bool,
        now_nanos: i64,
    ) -> DfResult<usize> {
        let oldest = first_time(ctx, "SELECT min(time) FROM gpu_metrics")
            .await?
            .map(floor_hour);
        let files = table_files(store);
        let reload = {
            let s = self.lock();
            !s.loaded || s.oldest_raw_hour != oldest || (!fold && s.files != files)
        };
        if reload {
            self.load(ctx, store, oldest, files).await?;
        }
        let folded = match oldest {
            Some(oldest) if fold => self.fold_closed(ctx, store, oldest, now_nanos).await?,
            _ => 0,
        };
        if fold {
            self.roll_due(ctx, store).await?;
            let written = self.total_due(ctx, store).await? + self.fill_hosts(ctx, store).await?;
            if folded > 0 || written > 0 {
                self.find_overlap(ctx).await?;
            }
        }
        let _ = self.store.set(Arc::clone(store));
        // The groups only speed questions up: without them `job_groups` reads as `jobs` does.
        let started = std::time::Instant::now();
        match self.make_groups(ctx, store).await {
            Ok(0) => {}
            Ok(days) => tracing::info!(
                days,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "job ledger: job groups made"
            ),
            Err(e) => tracing::warn!(error = %e, "job ledger: job groups not made"),
        }
        Ok(folded)
    }

    /// Reads the folded hours, the watermark and the seed from the table.
    async fn load(
        &self,
        ctx: &SessionContext,
        store: &Store,
        oldest: Option<i64>,
        files: Vec<String>,
    ) -> DfResult<()> {
        let mut state = State {
            loaded: true,
            files,
            oldest_raw_hour: oldest,
            hosts_filled: self.lock().hosts_filled,
            ..State::default()
        };
        match oldest {
            None => state.watermark = table_end(store),
            Some(oldest) => {
                let mut hours = table::hours_from(ctx, oldest).await?;
                let mut w = oldest;
                while hours.contains_key(&w) {
                    w += HOUR;
                }
                hours.retain(|&h, _| h < w);
                state.hours = hours;
                state.watermark = Some(w);
                state.seed = table::seed_between(ctx, oldest, w).await?;
            }
        }
        let hours = totals::ledger_hours(ctx).await?;
        if let Some(w) = state.watermark {
            state.days = days::read(ctx, w, &hours).await?;
        }
        state.totals = totals::Totals {
            hours,
            written: totals::markers(ctx).await?,
        };
        let ready = self.spans_ready();
        if ready {
            self.index_unread(ctx, store).await?;
        }
        self.publish(&state)?;
        *self.lock() = state;
        if !ready {
            let started = std::time::Instant::now();
            self.index_unread(ctx, store).await?;
            self.spans_mut().set_ready();
            tracing::info!(
                jobs = self.spans_len(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "job ledger: every job's hours read; questions about some jobs read only theirs"
            );
        }
        self.find_overlap(ctx).await
    }

    /// Finds the jobs seen at or after the totals' end that also have a row in them, and
    /// publishes.
    async fn find_overlap(&self, ctx: &SessionContext) -> DfResult<()> {
        let end = self.lock().totals.end();
        let (overlap, days) = match end.filter(|_| self.spans_ready()) {
            Some(end) => {
                let (jobs, first) = self.spans().started_before(end);
                totals::overlap(&ctx.state(), jobs, first, end).await?
            }
            None => Default::default(),
        };
        let mut s = self.lock();
        s.overlap = overlap;
        s.overlap_days = days;
        self.publish(&s)
    }

    /// Reads each job's hours from the table's files the index has not read ([`spans`]).
    async fn index_unread(&self, ctx: &SessionContext, store: &Store) -> DfResult<()> {
        let files = store.files(Table::JobLedger);
        let Some((from, paths)) = self.spans().unread(&files) else {
            return Ok(());
        };
        let started = std::time::Instant::now();
        let rows = spans::read(ctx, from).await?;
        let mut spans = self.spans_mut();
        spans.merge(rows, paths);
        tracing::debug!(
            jobs = spans.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "job ledger: jobs' hours indexed"
        );
        Ok(())
    }

    /// Refolds from the first stale hour and folds every hour closed by `now_nanos`.
    async fn fold_closed(
        &self,
        ctx: &SessionContext,
        store: &Arc<Store>,
        oldest: i64,
        now_nanos: i64,
    ) -> DfResult<usize> {
        let closed_end = floor_hour(now_nanos.saturating_sub(SETTLE.as_nanos() as i64));
        let (w, mut seed) = {
            let s = self.lock();
            (s.watermark.unwrap_or(oldest).max(oldest), s.seed.clone())
        };
        let from = match self.stale_hour(ctx, oldest).await? {
            Some(stale) if stale < w => {
                seed = table::seed_between(ctx, oldest, stale).await?;
                stale
            }
            _ => w,
        };
        let mut folded = 0;
        let mut hour = from;
        while hour < closed_end {
            let fold = self.fold_hour(ctx, hour, &seed).await?;
            let batch = table::hour_batch(hour, &fold)?;
            let writer = Arc::clone(store);
            tokio::task::spawn_blocking(move || {
                writer.replace_hour(Table::JobLedger, hour.div_euclid(HOUR), &batch)
            })
            .await
            .map_err(plain)?
            .map_err(plain)?;
            {
                let mut spans = self.spans_mut();
                for (job, ..) in fold.usage.keys() {
                    spans.add(job, hour);
                }
            }
            seed.extend(fold.last);
            hour += HOUR;
            folded += 1;
            let mut s = self.lock();
            // A refold makes every later hour's seed unsure: this same loop folds them again.
            s.hours.retain(|&h, _| h < hour - HOUR);
            s.hours.insert(hour - HOUR, fold.samples);
            s.totals.hours.insert(hour - HOUR, fold.samples as i64);
            s.watermark = Some(hour);
            // The day's sums no longer match its hours until it is rolled again.
            let day = days::floor_day(hour - HOUR);
            s.days.current.remove(&day);
            s.days.grouped.remove(&day);
            s.days.due.insert(day);
            if folded % PUBLISH_EVERY == 0 || hour >= closed_end {
                s.seed = seed.clone();
                self.publish(&s)?;
            }
        }
        Ok(folded)
    }

    /// Writes the sums of every due day whose hours are all folded ([`days`]), publishing
    /// as they are written.
    async fn roll_due(&self, ctx: &SessionContext, store: &Arc<Store>) -> DfResult<()> {
        let (due, w) = {
            let s = self.lock();
            (s.days.due.clone(), s.watermark)
        };
        let Some(w) = w else { return Ok(()) };
        let started = std::time::Instant::now();
        let mut rolled = 0;
        for day in due.into_iter().filter(|d| d + days::DAY <= w) {
            let samples = days::roll(ctx, store, day).await?;
            let mut s = self.lock();
            s.days.due.remove(&day);
            if let Some(n) = samples {
                s.days.current.insert(day, n);
                s.days.grouped.insert(day, n);
                rolled += 1;
                if rolled % PUBLISH_EVERY == 0 {
                    self.publish(&s)?;
                }
            }
        }
        if rolled > 0 {
            self.publish(&self.lock())?;
            tracing::info!(
                days = rolled,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "job ledger: days summed"
            );
        }
        Ok(())
    }

    /// Writes the per-job totals of every day whose file is missing or stale and whose next
    /// day is folded ([`totals`]), oldest first, publishing when done.
    async fn total_due(&self, ctx: &SessionContext, store: &Arc<Store>) -> DfResult<usize> {
        if !self.spans_ready() {
            return Ok(0);
        }
        let started = std::time::Instant::now();
        let state = ctx.state();
        let mut written = 0;
        let mut last: Vec<i64> = Vec::new();
        loop {
            let (due, runs, totals) = {
                let s = self.lock();
                let Some(w) = s.watermark else { break };
                (
                    s.totals.due(w),
                    days::runs(&s.days.current, w),
                    s.totals.clone(),
                )
            };
            // Days written stop being due; should the same days come back, the next pass
            // tries again rather than this one looping.
            if due.is_empty() || due == last {
                break;
            }
            last = due.clone();
            for &day in &due {
                let (jobs, first) = self.spans().ending_in(day, day + days::DAY);
                let d = totals::DayJobs {
                    day,
                    jobs,
                    first,
                    runs: runs.clone(),
                };
                let marker = totals::write(&state, store, &totals, d).await?;
                self.lock().totals.written.insert(day, marker);
                written += 1;
            }
            self.publish(&self.lock())?;
        }
        if written > 0 {
            tracing::info!(
                days = written,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "job ledger: jobs' totals written"
            );
        }
        Ok(written)
    }

    /// Once per server, gives the totals files of an earlier release their jobs' host counts
    /// ([`totals::fill_job_host_count`]); until then the `jobs` rows read from them have none.
    async fn fill_hosts(&self, ctx: &SessionContext, store: &Arc<Store>) -> DfResult<usize> {
        if self.lock().hosts_filled {
            return Ok(0);
        }
        let started = std::time::Instant::now();
        let filled = totals::fill_job_host_count(ctx, store).await?;
        self.lock().hosts_filled = true;
        if filled > 0 {
            tracing::info!(
                days = filled,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "job ledger: jobs' host counts added to the totals of an earlier release"
            );
        }
        Ok(filled)
    }

    /// The earliest folded hour (from the oldest raw sample's on) whose `gpu_metrics_1h`
    /// samples differ from the samples folded.
    async fn stale_hour(&self, ctx: &SessionContext, oldest: i64) -> DfResult<Option<i64>> {
        let (hours, w) = {
            let s = self.lock();
            (s.hours.clone(), s.watermark)
        };
        let Some(w) = w.filter(|&w| w > oldest) else {
            return Ok(None);
        };
        let sql = format!(
            "SELECT CAST(date_bin(INTERVAL '1 hour', time) AS BIGINT) AS h, sum(samples) AS n \
             FROM gpu_metrics_1h WHERE time >= to_timestamp_nanos({oldest}) \
             AND time < to_timestamp_nanos({w}) GROUP BY 1"
        );
        let batches = ctx.sql(&sql).await?.collect().await?;
        let mut stale: Option<i64> = None;
        for b in &batches {
            let h = cast(b.column(0), &DataType::Int64)?;
            let h = h.as_primitive::<Int64Type>();
            let n = cast(b.column(1), &DataType::Int64)?;
            let n: &Int64Array = n.as_primitive();
            for i in 0..b.num_rows() {
                if h.is_null(i) || n.is_null(i) {
                    continue;
                }
                let hour = h.value(i);
                if hours.get(&hour).copied().unwrap_or(0) != n.value(i).max(0) as u64 {
                    stale = Some(stale.map_or(hour, |s| s.min(hour)));
                }
            }
        }
        Ok(stale)
    }

    /// Reads the table and folds hours as they close, every [`TICK`], until `stop` turns true;
    /// `fold` is false on a server that only reads the table (a query node, or one that does
    /// not run maintenance).
    pub async fn run(
        self: Arc<Self>,
        ctx: SessionContext,
        store: Arc<Store>,
        fold: bool,
        clock: Arc<dyn Clock>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            let started = std::time::Instant::now();
            match self.step(&ctx, &store, fold, clock.now_nanos()).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    hours = n,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "job ledger: hours folded"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "job ledger: fold failed; the jobs view reads raw samples past the last folded hour")
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                r = stop.changed() => if r.is_err() || *stop.borrow() { return },
            }
        }
    }
}

async fn first_time(ctx: &SessionContext, sql: &str) -> DfResult<Option<i64>> {
    let batches = ctx.sql(sql).await?.collect().await?;
    for b in batches {
        if b.num_rows() > 0 {
            let t = cast(b.column(0), &DataType::Int64)?;
            let t = t.as_primitive::<Int64Type>();
            if !t.is_null(0) {
                return Ok(Some(t.value(0)));
            }
        }
    }
    Ok(None)
}
