//! The views over the ledger: `jobs` (one row per job and host), `job_hours` (one row per
//! job, host, GPU model and hour), `job_days` (the same per day, what monthly statements
//! sum) and `spend_days` (`job_days` per day, account, user and GPU model). Each is the
//! ledger's folded hours (`jobs` and `job_days` read whole days from its daily sums,
//! `spend_days` from its daily spend, [`days`]) plus the same formulas over the raw samples at
//! or after the watermark, planned in a catalog of their own so that the two parts always
//! agree.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{
    CatalogProvider, CatalogProviderList, MemTable, MemoryCatalogProvider,
    MemoryCatalogProviderList, MemorySchemaProvider, SchemaProvider, Session, TableProvider,
};
use datafusion::dataframe::DataFrame;
use datafusion::datasource::TableType;
use datafusion::error::Result as DfResult;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::optimizer::OptimizerRule;
use datafusion::physical_plan::ExecutionPlan;

use super::super::limiter::{self, LIMITERS};
use super::super::work::WORK_COLUMNS;
use super::super::{CHARGE_COLUMNS, MEAN_ACTIVITY, charge_list_sql, charge_max_sql, num, shares};
use super::bounds::Ask;
use super::spans::{self, Range};
use super::table::GROUP_JOBS;
use super::{JobLedger, Snapshot, days, groups, plain, raw_columns, table, totals};

/// Which view over the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// `jobs`: one row per job and host.
    Jobs,
    /// `job_hours`: one row per job, host, GPU model and hour (UTC).
    Hours,
    /// `job_days`: one row per job, host, GPU model and day (UTC).
    Days,
    /// `spend_days`: one row per day (UTC), account, user and GPU model, `job_days` grouped by
    /// them, read from `job_ledger_spend` ([`days`]) where a day's spend matches its hours.
    Spend,
    /// `job_groups`: the `jobs` rows grouped by the days their jobs were last and first seen,
    /// user, account, GPU model and limiter ([`groups`]).
    Groups,
}

impl View {
    /// Whether the view may read the ledger's daily sums (`job_hours` needs every hour).
    fn reads_days(self) -> bool {
        self != View::Hours
    }
}

impl JobLedger {
    /// The CTEs the views share, over the ledger's table before the watermark (and its daily
    /// sums for the days in `days`), the seed (`job_seed`) and the raw samples at or after the
    /// watermark: `p` has one row per job, GPU and hour (or day) with its sums, `price` and
    /// `day`.
    fn usage_ctes(
        &self,
        view: View,
        watermark: Option<i64>,
        read: &LedgerRead,
        days: &[(i64, i64)],
    ) -> String {
        let cost = &self.cost;
        let class_columns: String = LIMITERS
            .iter()
            .map(|c| format!(", {}", limiter::seconds_column(c)))
            .collect();
        let gap = cost.max_sample_gap().as_nanos();
        let idle = num(cost.idle_utilization);
        let after = match watermark {
            _ if read.skip_raw => "false".to_string(),
            Some(w) => format!("time >= to_timestamp_nanos({w})"),
            None => "true".to_string(),
        };
        let charge = charge_list_sql();
        let (before, in_days) = read.condition(watermark, days);
        let sums = format!(
            "job_id, host, gpu_uuid, gpu_model, scheduler, job_user, job_name, first_seen, last_seen,
    gpu_seconds, held_gpu_seconds, idle_gpu_seconds, energy_joules, idle_energy_joules, {activity}{class_columns}{charge}, {GROUP_JOBS}, time AS hour",
            activity = table::ACTIVITY_PARTS.join(", "),
        );
        // `spend_days` reads a day's spend, the other views its job rows.
        let (day_table, day_kind) = match view {
            View::Spend => (days::SPEND, format!("{GROUP_JOBS} IS NOT NULL")),
            _ => (days::NAME, "job_id IS NOT NULL".to_string()),
        };
        let day_rows = in_days.map_or(String::new(), |c| {
            format!("\n  UNION ALL\n  SELECT {sums}\n  FROM {day_table} WHERE {day_kind} AND {c}")
        });
        let raw = raw_columns();
        let charge_max = charge_max_sql(false);
        let mut present = vec!["job_user", "job_name"];
        present.extend(CHARGE_COLUMNS);
        format!(
            r#"WITH s AS (
  SELECT time, host, gpu_uuid, gpu_model, job_id, scheduler, job_user, job_name, gpu_utilization, sm_active, energy_joules, limiter{charge}, job_shares,
    CAST(time AS BIGINT) - CAST(lag(time) OVER (PARTITION BY host, gpu_uuid ORDER BY time) AS BIGINT) AS dt_ns,
    energy_joules - lag(energy_joules) OVER (PARTITION BY host, gpu_uuid ORDER BY time) AS de
  FROM (SELECT {raw}, sm_active, {class} AS limiter FROM gpu_metrics WHERE {after}
        UNION ALL SELECT {raw}, CAST(NULL AS DOUBLE) AS sm_active, CAST(NULL AS VARCHAR) AS limiter FROM job_seed) r
), d0 AS (
  SELECT job_id, scheduler, job_user, job_name, host, gpu_uuid, gpu_model, time, gpu_utilization, sm_active, limiter{charge}, job_shares,
    date_bin(INTERVAL '1 hour', time) AS hour,
    CASE WHEN dt_ns IS NULL OR dt_ns <= 0 THEN 0.0 WHEN dt_ns > {gap} THEN CAST({gap} AS DOUBLE) / 1e9 ELSE CAST(dt_ns AS DOUBLE) / 1e9 END AS secs,
    CASE WHEN de IS NULL THEN 0.0 WHEN de < 0 THEN energy_joules ELSE de END AS joules,
    COALESCE(gpu_utilization < {idle}, false) AS idle
  FROM s WHERE job_id IS NOT NULL AND {after}
), {split}, u AS (
  SELECT {sums}
  FROM {ledger} WHERE job_id IS NOT NULL AND {before}{day_rows}
  UNION ALL
  SELECT job_id, host, gpu_uuid, gpu_model, max(scheduler), max(job_user), max(job_name), min(time), max(time),
    sum(secs), sum(held), sum(CASE WHEN idle THEN secs ELSE 0.0 END), sum(joules), sum(CASE WHEN idle THEN joules ELSE 0.0 END),
    {sample_activity},
    {class_sums}{charge_max}, CAST(NULL AS BIGINT), hour
  FROM d GROUP BY job_id, host, gpu_uuid, gpu_model, hour
), p AS (
  SELECT u.*, {price} AS price, date_bin(INTERVAL '1 day', hour) AS day FROM u
)"#,
            class = self.class_sql(),
            price = cost.price_sql(),
            class_sums = limiter::class_sums_sql(),
            sample_activity = table::SAMPLE_ACTIVITY_PARTS.join(", "),
            split = shares::split_sql(&present, &format!("gpu_metrics WHERE {after}"), ""),
            ledger = table::NAME,
        )
    }

    /// The view's SQL over the snapshot's tables, before its work columns.
    fn core_sql(
        &self,
        view: View,
        watermark: Option<i64>,
        read: &LedgerRead,
        days: &[(i64, i64)],
    ) -> String {
        if view == View::Groups {
            let jobs = self.core_sql(View::Jobs, watermark, read, days);
            return groups::group_select(&jobs);
        }
        let days = if view.reads_days() { days } else { &[] };
        let ctes = self.usage_ctes(view, watermark, read, days);
        if view == View::Spend {
            return format!("{ctes}\n{}", self.spend_select());
        }
        // Each job of `p` is there whole (with all its hosts), so its rows count its hosts;
        // `nullif` keeps the column nullable, as the totals' is.
        let summed = self.grouped_select(
            view,
            (
                "count(DISTINCT gpu_uuid)",
                "nullif(count(*) OVER (PARTITION BY job_id), 0)",
            ),
            "p",
        );
        match (&read.totals, view) {
            (Some(t), View::Jobs) => format!("{ctes}\n{summed}\n{}", self.totals_sql(t)),
            _ => format!("{ctes}\n{summed}"),
        }
    }

    /// The view's `SELECT` over `from` (rows with `price`), grouped by the view's key; `gpus`
    /// counts the GPUs of a group and (`jobs` only) `hosts` the hosts of its job.
    fn grouped_select(&self, view: View, (gpus, hosts): (&str, &str), from: &str) -> String {
        let energy_price = self.cost.energy_price_sql();
        let (key, extra) = match view {
            View::Jobs | View::Groups => (
                "job_id, host",
                format!(
                    ", {} AS limiter, max(gpu_model) AS gpu_model, {hosts} AS {}, {} AS {MEAN_ACTIVITY}",
                    limiter::argmax_sql(|c| format!("sum({})", limiter::seconds_column(c))),
                    table::JOB_HOST_COUNT,
                    table::mean_activity_sql(|c| format!("sum({c})")),
                ),
            ),
            View::Hours => ("hour, job_id, host, gpu_model", String::new()),
            View::Days | View::Spend => ("day, job_id, host, gpu_model", String::new()),
        };
        let lead = match view {
            View::Jobs | View::Groups => "",
            View::Hours => "hour, ",
            View::Days | View::Spend => "day, ",
        };
        format!(
            r#"SELECT {lead}job_id, max(scheduler) AS scheduler, max(job_user) AS job_user, max(job_name) AS job_name, host,
  {gpus} AS gpus, min(first_seen) AS first_seen, max(last_seen) AS last_seen,
  sum(gpu_seconds) AS gpu_seconds,
  CASE WHEN sum(held_gpu_seconds) > 0 THEN sum(gpu_seconds) / sum(held_gpu_seconds) ELSE 1.0 END AS share,
  sum(idle_gpu_seconds) AS idle_gpu_seconds,
  sum(energy_joules) AS energy_joules,
  sum(gpu_seconds * price) / 3600.0 + sum(energy_joules) * {energy_price} AS cost_usd,
  sum(idle_gpu_seconds * price) / 3600.0 + sum(idle_energy_joules) * {energy_price} AS idle_cost_usd{extra}{gpu_model}{charge_named}
FROM {from} GROUP BY {key}"#,
            gpu_model = if matches!(view, View::Jobs | View::Groups) {
                ""
            } else {
                ", gpu_model"
            },
            charge_named = charge_max_sql(true),
        )
    }

    /// `spend_days` over `p`: the `job_days` rows of the days read by the hour (or from raw
    /// samples) grouped by day, account, user and model, and the spend rows of the others
    /// (which [`days`] grouped the same way when it wrote them).
    fn spend_select(&self) -> String {
        let energy_price = self.cost.energy_price_sql();
        let key = "day, job_account, job_user, gpu_model";
        let job_rows = self.grouped_select(
            View::Days,
            ("count(DISTINCT gpu_uuid)", ""),
            "p WHERE job_id IS NOT NULL",
        );
        format!(
            r#"SELECT {key}, count(DISTINCT job_id) AS jobs, min(first_seen) AS first_seen, max(last_seen) AS last_seen,
  sum(gpu_seconds) AS gpu_seconds, sum(idle_gpu_seconds) AS idle_gpu_seconds, sum(energy_joules) AS energy_joules,
  sum(cost_usd) AS cost_usd, sum(idle_cost_usd) AS idle_cost_usd
FROM ({job_rows}) jd GROUP BY {key}
UNION ALL
SELECT {key}, coalesce({GROUP_JOBS}, 0) AS jobs, first_seen, last_seen, gpu_seconds, idle_gpu_seconds, energy_joules,
  gpu_seconds * price / 3600.0 + energy_joules * {energy_price} AS cost_usd,
  idle_gpu_seconds * price / 3600.0 + idle_energy_joules * {energy_price} AS idle_cost_usd
FROM p WHERE job_id IS NULL"#
        )
    }

    /// `UNION ALL` the `jobs` rows of the finished jobs from their totals ([`totals`]).
    fn totals_sql(&self, t: &TotalsRead) -> String {
        format!("UNION ALL\n{}", self.totals_rows_sql(t))
    }

    /// The `jobs` rows of the finished jobs from their totals ([`totals`]): a row as it is
    /// where the job used one GPU model on the host, grouped by host otherwise. `gpus` is never
    /// null there, as the `count` it stands beside (a union whose inputs disagree on that
    /// fails to plan above an aggregate).
    pub(super) fn totals_rows_sql(&self, t: &TotalsRead) -> String {
        let energy_price = self.cost.energy_price_sql();
        // The marker rows have no `last_seen`.
        let mut within = format!(
            "last_seen IS NOT NULL AND time < to_timestamp_nanos({})",
            t.end
        );
        if !t.overlap.is_empty() {
            let ids: Vec<String> = t.overlap.iter().map(|j| super::super::sql_str(j)).collect();
            within.push_str(&format!(" AND job_id NOT IN ({})", ids.join(", ")));
        }
        if let Some(low) = t.low {
            within.push_str(&format!(
                " AND time >= to_timestamp_nanos({}) AND last_seen >= to_timestamp_nanos({low})",
                days::floor_day(low)
            ));
        }
        if let Some(high) = t.high {
            within.push_str(&format!(" AND first_seen <= to_timestamp_nanos({high})"));
        }
        if let Some(high) = t.last_high {
            // A job's row is in the file of the day it was last seen.
            within.push_str(&format!(
                " AND time <= to_timestamp_nanos({}) AND last_seen <= to_timestamp_nanos({high})",
                days::floor_day(high)
            ));
        }
        if let Some(ids) = &t.jobs {
            within.push_str(&format!(" AND job_id IN ({ids})"));
        }
        if let Some(days) = &t.days {
            within.push_str(&format!(" AND {}", days::in_runs_sql(days)));
        }
        let rows = format!(
            "(SELECT *, {price} AS price FROM {name} WHERE {within}) t",
            price = self.cost.price_sql(),
            name = totals::NAME,
        );
        format!(
            r#"SELECT job_id, scheduler, job_user, job_name, host, coalesce(gpus, 0) AS gpus, first_seen, last_seen, gpu_seconds,
  CASE WHEN held_gpu_seconds > 0 THEN gpu_seconds / held_gpu_seconds ELSE 1.0 END AS share,
  idle_gpu_seconds, energy_joules,
  gpu_seconds * price / 3600.0 + energy_joules * {energy_price} AS cost_usd,
  idle_gpu_seconds * price / 3600.0 + idle_energy_joules * {energy_price} AS idle_cost_usd,
  {limiter} AS limiter, gpu_model, {hosts}, {activity} AS {MEAN_ACTIVITY}{charge}
FROM {rows} WHERE host_models = 1
UNION ALL
{grouped}"#,
            limiter = stored_limiter_sql(),
            hosts = table::JOB_HOST_COUNT,
            activity = table::mean_activity_sql(str::to_string),
            charge = charge_list_sql(),
            grouped = self.grouped_select(
                View::Jobs,
                (
                    "coalesce(sum(gpus), 0)",
                    &format!("max({})", table::JOB_HOST_COUNT)
                ),
                &format!("{rows} WHERE host_models > 1")
            ),
        )
    }

    /// The view's rows over `snap` (of the ledger, what `read` names), as a data frame.
    async fn frame(
        &self,
        view: View,
        state: &SessionState,
        snap: &Snapshot,
        read: &LedgerRead,
        work: bool,
    ) -> DfResult<DataFrame> {
        let seed = MemTable::try_new(snap.seed.schema(), vec![vec![snap.seed.clone()]])?;
        let mut own: Vec<(&str, Arc<dyn TableProvider>)> = vec![("job_seed", Arc::new(seed))];
        let mut shared = vec![
            "gpu_metrics",
            "metrics",
            table::NAME,
            days::NAME,
            days::SPEND,
        ];
        if let Some(t) = &read.totals {
            let recent = totals::job_batch(t.recent.iter().map(String::as_str))?;
            own.push((
                RECENT,
                Arc::new(MemTable::try_new(recent.schema(), vec![vec![recent]])?),
            ));
            shared.push(totals::NAME);
        }
        let private = private_state(state, &shared, own).await?;
        let days = match view {
            View::Spend => &snap.grouped_days,
            _ => &snap.days,
        };
        let core = self.core_sql(view, snap.watermark, read, days);
        let sql = match view {
            _ if !work => core,
            View::Spend | View::Groups => core,
            View::Jobs => self.work.jobs_with_work(&core),
            View::Hours => self.work.rows_with_work(&core, "hour"),
            View::Days => self.work.rows_with_work(&core, "day"),
        };
        let plan = private.create_logical_plan(&sql).await?;
        Ok(DataFrame::new(private, plan))
    }

    /// `job_groups`' rows for `read` ([`groups`]): the groups made before of the days it
    /// names, and the others grouped now; every day grouped now where the made ones do not fit.
    async fn groups_frame(
        &self,
        state: &SessionState,
        snap: &Snapshot,
        read: &mut LedgerRead,
    ) -> DfResult<DataFrame> {
        let made = read.made.take();
        let frame = self.frame(View::Groups, state, snap, read, false).await?;
        let Some(made) = made else {
            return Ok(frame);
        };
        if let Some(frame) = groups::with_made(frame, &made)? {
            return Ok(frame);
        }
        if let Some(t) = read.totals.as_mut() {
            t.days = None;
        }
        self.frame(View::Groups, state, snap, read, false).await
    }
}

/// The stored `limiter` of a totals row as the literal the view's other rows compute (of the
/// same type: the column reads as a string view, the literals are plain strings, and a union
/// of the two fails to plan).
fn stored_limiter_sql() -> String {
    let arms: String = LIMITERS
        .iter()
        .map(|c| format!(" WHEN '{c}' THEN '{c}'"))
        .collect();
    format!("CASE limiter{arms} END")
}

/// A session over `state` whose catalog holds `state`'s tables named in `shared` and the
/// tables in `own`: the ledger's statements run over exactly these, whatever the server's
/// catalog holds.
pub(super) async fn private_state(
    state: &SessionState,
    shared: &[&str],
    own: Vec<(&str, Arc<dyn TableProvider>)>,
) -> DfResult<SessionState> {
    let options = state.config_options();
    let (catalog_name, schema_name) = (
        options.catalog.default_catalog.clone(),
        options.catalog.default_schema.clone(),
    );
    let server = state
        .catalog_list()
        .catalog(&catalog_name)
        .and_then(|c| c.schema(&schema_name))
        .ok_or_else(|| plain("the jobs view: no default schema"))?;
    let schema = MemorySchemaProvider::new();
    for name in shared {
        let table = server
            .table(name)
            .await?
            .ok_or_else(|| plain(format!("the jobs view: no {name} table")))?;
        schema.register_table(name.to_string(), table)?;
    }
    for (name, table) in own {
        schema.register_table(name.to_string(), table)?;
    }
    let catalog = MemoryCatalogProvider::new();
    catalog.register_schema(&schema_name, Arc::new(schema))?;
    let list = MemoryCatalogProviderList::new();
    list.register_catalog(catalog_name, Arc::new(catalog));
    // The Parquet reader applies the views' filters itself, decoding the other columns only
    // for the rows that pass: `jobs` reads the per-job totals twice, once for the rows of one
    // GPU model on a host and once for the few others, and a year of them is 7 million rows.
    let mut builder = SessionStateBuilder::new_from_existing(state.clone());
    if let Some(config) = builder.config() {
        config.options_mut().execution.parquet.pushdown_filters = true;
    }
    Ok(builder
        .with_catalog_list(Arc::new(list))
        .with_optimizer_rules(projections_first(state.optimizers()))
        .build())
}

/// The logical optimizer's rules with the rewrite of a single `DISTINCT` aggregate into a
/// second grouping moved after the pruning of unused columns. The views compute `gpus` as
/// `count(DISTINCT gpu_uuid)`; a question that does not ask for it (every Cost panel) would
/// otherwise group every job's rows by GPU first (15 million groups over a year of 10,000
/// GPUs, spilled to disk) for an aggregate that the pruning then removes.
fn projections_first(
    rules: &[Arc<dyn OptimizerRule + Send + Sync>],
) -> Vec<Arc<dyn OptimizerRule + Send + Sync>> {
    const DISTINCT: &str = "single_distinct_aggregation_to_group_by";
    const PRUNE: &str = "optimize_projections";
    let mut out: Vec<_> = rules
        .iter()
        .filter(|r| r.name() != DISTINCT)
        .cloned()
        .collect();
    if let Some(distinct) = rules.iter().find(|r| r.name() == DISTINCT) {
        let at = out
            .iter()
            .position(|r| r.name() == PRUNE)
            .map_or(out.len(), |i| i + 1);
        out.insert(at, Arc::clone(distinct));
    }
    out
}

/// The in-memory table of the jobs `jobs` reads from the ledger's hours and days when it
/// reads the totals of the others.
const RECENT: &str = "job_recent";

/// What a view reads of the ledger's table below the watermark.
#[derive(Debug, Default)]
pub(super) struct LedgerRead {
    /// `job_groups`: the groups made before of the days the totals' read leaves out.
    pub made: Option<Vec<RecordBatch>>,
    /// Only these hours (`None`: every hour).
    pub hours: Option<Range>,
    /// Only these jobs (`None`: every job).
    pub jobs: Option<Vec<String>>,
    /// The per-job totals `jobs` reads; the hours and days are then read for the jobs in
    /// [`RECENT`] only.
    pub totals: Option<TotalsRead>,
    /// No job asked for has raw samples after the watermark: the raw samples are not read
    /// (their per-GPU intervals cost a sort of the last hour's samples whatever the job).
    pub skip_raw: bool,
}

/// What `jobs` reads of the per-job totals ([`totals`]).
#[derive(Debug, Default)]
pub(super) struct TotalsRead {
    /// The totals' end.
    pub end: i64,
    /// The jobs read from the ledger's hours and days instead (seen at or after `end`, or
    /// after the watermark).
    pub recent: Vec<String>,
    /// The question's bounds: last seen at or after, first seen at or before, last seen at or
    /// before.
    pub low: Option<i64>,
    pub high: Option<i64>,
    pub last_high: Option<i64>,
    /// The question's jobs, as an SQL list.
    pub jobs: Option<String>,
    /// The days of the files holding the question's jobs (runs `[from, to)`; `None`: every
    /// day): a job's row is in the file of the day of its last hour.
    pub days: Option<Vec<(i64, i64)>>,
    /// The recent jobs with a row in the totals, which the view leaves out.
    pub overlap: Vec<String>,
}

impl LedgerRead {
    /// The conditions on the rows of the ledger's table and of its daily sums (`None`: none
    /// read): below the watermark `w` (nothing before any fold), within the hours and jobs;
    /// the days in `days` (runs `[from, to)`) are read from the daily sums, their hours not.
    pub(super) fn condition(
        &self,
        w: Option<i64>,
        days: &[(i64, i64)],
    ) -> (String, Option<String>) {
        let Some(w) = w.filter(|_| self.jobs.as_ref().is_none_or(|j| !j.is_empty())) else {
            return ("false".into(), None);
        };
        // The days overlapping the hours read, clipped to them: their hours are read from the
        // daily sums (whole days: a wider read, which a bound may always be).
        let (from, to) = self.hours.unwrap_or((i64::MIN, w));
        let first = days::floor_day(from.max(i64::MIN / 2));
        let end = days::floor_day(to.min(w).min(i64::MAX / 2) + days::DAY - 1);
        let days: Vec<(i64, i64)> = days
            .iter()
            .map(|&(a, b)| (a.max(first), b.min(end)))
            .filter(|(a, b)| a < b)
            .collect();
        let (lo, hi) = (from, to.min(w));
        if days.is_empty() {
            return (self.hour_condition(&[(lo, hi)]), None);
        }
        // The hours outside those days, as ranges (not `NOT days`, which prunes no file).
        let hours = self.hour_condition(&days::gaps(lo, hi, &days));
        let in_days = days::in_runs_sql(&days);
        let mut on_days = in_days;
        if let Some(ids) = self.job_list() {
            on_days = format!("{on_days} AND job_id IN ({ids})");
        }
        if self.totals.is_some() {
            on_days = format!("{on_days} AND job_id IN (SELECT job_id FROM {RECENT})");
        }
        (hours, Some(on_days))
    }

    /// The jobs as an SQL list, when the read names them (and at least one).
    fn job_list(&self) -> Option<String> {
        let ids = self.jobs.as_ref()?;
        let list: Vec<String> = ids.iter().map(|j| super::super::sql_str(j)).collect();
        (!list.is_empty()).then(|| list.join(", "))
    }

    /// The condition on the ledger's hour rows in `runs` (`[from, to)`; `i64::MIN`: no lower
    /// bound).
    fn hour_condition(&self, runs: &[(i64, i64)]) -> String {
        let mut c = days::in_runs_sql(runs);
        if let Some(ids) = self.job_list() {
            c = format!("{c} AND job_id IN ({ids})");
        }
        if self.totals.is_some() {
            c = format!("{c} AND job_id IN (SELECT job_id FROM {RECENT})");
        }
        c
    }
}

impl JobLedger {
    /// What a question `ask` over `snap` reads of the table: the hours of the jobs it may
    /// return ([`spans`]), once the index is read.
    pub(super) async fn read_for(
        &self,
        state: &SessionState,
        snap: &Snapshot,
        view: View,
        mut ask: Ask,
    ) -> DfResult<LedgerRead> {
        let totals = snap
            .totals
            .as_ref()
            .filter(|_| matches!(view, View::Jobs | View::Groups));
        // A job's hours read short of its last would seem to end earlier: a bound on when
        // jobs were last seen holds only for whole jobs (the totals' rows, the recent jobs).
        if totals.is_none() {
            ask.last_high = None;
        }
        let Some(w) = snap
            .watermark
            .filter(|_| (ask.bounded() || totals.is_some()) && self.spans_ready())
        else {
            return Ok(LedgerRead::default());
        };
        let before_raw = ask.ends_before_raw(view, w);
        // The live jobs are needed to leave them out when their raw samples are not read.
        let live = if before_raw && ask.last_high.is_none() {
            Default::default()
        } else {
            let ctx = datafusion::prelude::SessionContext::new_with_state(state.clone());
            spans::live(&ctx, w).await?
        };
        let skip_raw = before_raw
            || ask
                .jobs
                .as_ref()
                .is_some_and(|ids| !ids.iter().any(|j| live.contains(j)));
        let Some(t) = totals else {
            return Ok(LedgerRead {
                hours: self.spans().range(&ask, &live, w),
                jobs: ask.jobs,
                totals: None,
                skip_raw,
                made: None,
            });
        };
        let (mut ids, overlap) = self.recent_jobs(t, &live, ask.jobs.as_deref())?;
        self.keep_returnable(&mut ids, &ask, &live, skip_raw);
        let hours = self.spans().range(
            &Ask {
                jobs: Some(ids.clone()),
                ..ask.clone()
            },
            &live,
            w,
        );
        let read = LedgerRead {
            hours,
            jobs: ask.jobs,
            totals: None,
            skip_raw,
            made: None,
        };
        let jobs = read.job_list();
        let days = read
            .jobs
            .as_deref()
            .map(|asked| self.totals_days(asked, t.end));
        Ok(LedgerRead {
            totals: Some(TotalsRead {
                end: t.end,
                recent: ids,
                low: ask.low,
                high: ask.high,
                last_high: ask.last_high,
                jobs,
                days,
                overlap,
            }),
            ..read
        })
    }

    /// Keeps those of the recent jobs `ids` that `ask` may return, when it bounds when they
    /// were last seen: the others are left out whole (read in part, they would seem to end
    /// earlier), the live ones too when their raw samples are not read (`skip_raw`).
    fn keep_returnable(
        &self,
        ids: &mut Vec<String>,
        ask: &Ask,
        live: &std::collections::HashSet<String>,
        skip_raw: bool,
    ) {
        if ask.last_high.is_none() {
            return;
        }
        let spans = self.spans();
        ids.retain(|j| {
            let live = live.contains(j);
            !(live && skip_raw) && spans.span(j).is_none_or(|s| ask.may_return(s, live))
        });
    }

    /// The days (runs `[from, to)`) of the totals' files that hold the jobs `asked`: the day
    /// of each one's last hour, where that is before the totals' `end` (the others are read
    /// from the hours and days). A job seen again after its file was written has its last
    /// hour later, and is left out of the totals as an overlap.
    fn totals_days(&self, asked: &[String], end: i64) -> Vec<(i64, i64)> {
        let spans = self.spans();
        let days: std::collections::BTreeSet<i64> = asked
            .iter()
            .filter_map(|j| spans.last_hour(j))
            .filter(|&last| last < end)
            .map(days::floor_day)
            .collect();
        days::day_runs(days)
    }

    /// The jobs `jobs` reads from the ledger's hours and days when it reads the totals `t`
    /// (those seen at or after their end and those in raw samples after the watermark, `live`;
    /// among `asked` when given), and those of them with a row in the totals: the snapshot's,
    /// and the live jobs last folded before the end (seen again after days away).
    fn recent_jobs(
        &self,
        t: &super::TotalsSnap,
        live: &std::collections::HashSet<String>,
        asked: Option<&[String]>,
    ) -> DfResult<(Vec<String>, Vec<String>)> {
        let wanted = |j: &String| asked.is_none_or(|a| a.contains(j));
        let mut ids: Vec<String> = super::strings(&t.recent, 0)?
            .iter()
            .flatten()
            .map(str::to_string)
            .chain(live.iter().cloned())
            .filter(wanted)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let spans = self.spans();
        let mut overlap: Vec<String> = t
            .overlap
            .iter()
            .cloned()
            .chain(
                live.iter()
                    .filter(|j| spans.last_hour(j).is_some_and(|l| l < t.end))
                    .cloned(),
            )
            .filter(wanted)
            .collect();
        overlap.sort_unstable();
        overlap.dedup();
        Ok((ids, overlap))
    }
}

/// A view over the ledger: [`JobLedger`]'s snapshot plus the raw samples after its watermark.
#[derive(Debug)]
pub struct JobsTable {
    ledger: Arc<JobLedger>,
    view: View,
    schema: SchemaRef,
}

impl JobsTable {
    /// The ledger the view reads.
    pub fn ledger(&self) -> &Arc<JobLedger> {
        &self.ledger
    }

    /// The view `view` over `ledger`; `state` plans it once for its schema.
    pub async fn new(ledger: Arc<JobLedger>, view: View, state: &SessionState) -> DfResult<Self> {
        let snap = Snapshot::empty();
        let schema = ledger
            .frame(view, state, &snap, &LedgerRead::default(), true)
            .await?
            .schema()
            .as_arrow()
            .clone();
        Ok(Self {
            ledger,
            view,
            schema: Arc::new(schema),
        })
    }
}

#[async_trait]
impl TableProvider for JobsTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    /// Every filter bounds what the view reads of the ledger where it can ([`Ask`]) and is
    /// applied to the view's rows after.
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let state = state
            .as_any()
            .downcast_ref::<SessionState>()
            .ok_or_else(|| plain("the jobs view needs a DataFusion session"))?;
        let snap = self.ledger.snapshot();
        let ask = Ask::of(self.view, filters, state);
        let mut read = self
            .ledger
            .read_for(state, &snap, self.view, ask.clone())
            .await?;
        let names: Option<Vec<&str>> = projection.map(|p| {
            p.iter()
                .map(|&i| self.schema.field(i).name().as_str())
                .collect()
        });
        // A question that asks for no work column does not read the job's counters.
        let work = names
            .as_ref()
            .is_none_or(|n| n.iter().any(|c| WORK_COLUMNS.contains(c)));
        let mut frame = if self.view == View::Groups {
            self.ledger.split_groups(&snap, &mut read, &ask);
            self.ledger.groups_frame(state, &snap, &mut read).await?
        } else {
            self.ledger
                .frame(self.view, state, &snap, &read, work)
                .await?
        };
        if let Some(names) = names {
            frame = frame.select_columns(&names)?;
        }
        if limit.is_some() {
            frame = frame.limit(0, limit)?;
        }
        frame.create_physical_plan().await
    }
}
