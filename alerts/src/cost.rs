//! Cost accounting: the `jobs` table, a SQL view over `gpu_metrics` priced from the `[cost]`
//! section of the config file (formulas in docs/cost.md).
//!
//! Each sample of a GPU accounts for the time since the previous sample of that GPU (at most
//! `max_sample_gap`, so a gap in the data is not billed as use) and for the energy counter's
//! increase since then; a decrease is a counter reset (driver reload, reboot) and counts the new
//! value, i.e. the energy used since the reset. The interval goes to the job the sample carries.
//!
//! ```text
//! gpu_seconds      = Σ dt
//! idle_gpu_seconds = Σ dt where gpu_utilization < idle_utilization
//! energy_joules    = Σ ΔE
//! cost_usd         = Σ dt × price(gpu_model) / 3600 + Σ ΔE / 3.6e6 × kwh_usd × pue
//! idle_cost_usd    = the same sums over idle samples only
//! limiter          = the class with the most Σ dt (limiter.rs, docs/jobs.md)
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{ArrayRef, Float64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::MemTable;
use datafusion::prelude::SessionContext;
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::rules::Dur;

/// A GPU-hour price for models matching a glob pattern (`*` and `?`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    /// Glob over `gpu_model`, e.g. `"*H100*"`.
    pub model: String,
    /// USD per GPU-hour.
    pub usd: f64,
}

/// The `[cost]` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostConfig {
    /// Per-model GPU-hour prices, first match wins.
    #[serde(default)]
    pub gpu_hour_usd: Vec<ModelPrice>,
    /// Price of a GPU-hour of a model no pattern matches [default: 0].
    #[serde(default)]
    pub default_gpu_hour_usd: f64,
    /// Electricity price, USD per kWh [default: 0].
    #[serde(default)]
    pub kwh_usd: f64,
    /// Power usage effectiveness of the data centre (facility / IT energy) [default: 1].
    #[serde(default = "one")]
    pub pue: f64,
    /// Longest interval one sample accounts for [default: 60s].
    #[serde(default)]
    pub max_sample_gap: Option<Dur>,
    /// A sample with `gpu_utilization` below this is idle [default: 0.01].
    #[serde(default = "idle")]
    pub idle_utilization: f64,
    /// Budgets per user, USD (table `budgets`, used by the `JobCostOverBudget` rule).
    #[serde(default)]
    pub user_budgets_usd: BTreeMap<String, f64>,
    /// Budget of users not listed, USD [default: none].
    #[serde(default)]
    pub default_budget_usd: Option<f64>,
    /// Monthly budgets per Slurm account, USD: the month's spend so far (calendar month, UTC)
    /// against it (table `group_budgets`, used by the `SpendOverBudget` rule).
    #[serde(default)]
    pub account_budgets_usd: BTreeMap<String, f64>,
    /// Monthly budgets per Kubernetes namespace, USD (as `account_budgets_usd`).
    #[serde(default)]
    pub namespace_budgets_usd: BTreeMap<String, f64>,
}

fn one() -> f64 {
    1.0
}
fn idle() -> f64 {
    0.01
}

impl Default for CostConfig {
    fn default() -> Self {
        Self {
            gpu_hour_usd: Vec::new(),
            default_gpu_hour_usd: 0.0,
            kwh_usd: 0.0,
            pue: 1.0,
            max_sample_gap: None,
            idle_utilization: 0.01,
            user_budgets_usd: BTreeMap::new(),
            default_budget_usd: None,
            account_budgets_usd: BTreeMap::new(),
            namespace_budgets_usd: BTreeMap::new(),
        }
    }
}

/// `s` as a SQL string literal (quotes doubled): a value, never SQL.
pub fn sql_str(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

pub(crate) fn glob_to_like(glob: &str) -> String {
    let mut out = String::new();
    for c in glob.chars() {
        match c {
            '*' => out.push('%'),
            '?' => out.push('_'),
            '%' | '_' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

fn num(v: f64) -> String {
    format!("CAST({v:?} AS DOUBLE)")
}

impl CostConfig {
    /// Checks the values.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str| Err(Error::Config(format!("cost: {what}")));
        if self.pue < 1.0 || !self.pue.is_finite() {
            return bad("pue must be at least 1 (facility energy / IT energy)");
        }
        if self.kwh_usd < 0.0 || self.default_gpu_hour_usd < 0.0 {
            return bad("prices must not be negative");
        }
        if self
            .gpu_hour_usd
            .iter()
            .any(|p| p.usd < 0.0 || p.model.is_empty())
        {
            return bad("each gpu_hour_usd entry needs a model pattern and a price of 0 or more");
        }
        if self.max_sample_gap().is_zero() {
            return bad("max_sample_gap must be above zero");
        }
        let budgets = [
            &self.user_budgets_usd,
            &self.account_budgets_usd,
            &self.namespace_budgets_usd,
        ];
        if budgets
            .iter()
            .flat_map(|m| m.values())
            .chain(&self.default_budget_usd)
            .any(|b| !(b.is_finite() && *b >= 0.0))
        {
            return bad("budgets must be numbers of 0 or more (USD)");
        }
        Ok(())
    }

    /// Effective max sample gap.
    pub fn max_sample_gap(&self) -> Duration {
        self.max_sample_gap.map_or(Duration::from_secs(60), |d| d.0)
    }

    /// The price expression (USD per GPU-hour) of column `gpu_model`.
    fn price_sql(&self) -> String {
        if self.gpu_hour_usd.is_empty() {
            return num(self.default_gpu_hour_usd);
        }
        let mut s = String::from("CASE");
        for p in &self.gpu_hour_usd {
            s.push_str(&format!(
                " WHEN gpu_model LIKE {} ESCAPE '\\' THEN {}",
                sql_str(&glob_to_like(&p.model)),
                num(p.usd)
            ));
        }
        s.push_str(&format!(" ELSE {} END", num(self.default_gpu_hour_usd)));
        s
    }

    /// The `jobs` view's query.
    pub fn jobs_sql(&self, jobs: &JobsConfig) -> String {
        jobs.work
            .jobs_with_work(&self.jobs_sql_where(&jobs.advice, "", ""))
    }

    /// The `jobs` view's query over whole GPUs (`gpus`) and samples (`filter`) only, as
    /// [`Self::sample_ctes`] takes them: for one job it gives the view's rows of that job while
    /// running the window functions over that job's GPUs only.
    pub(crate) fn jobs_sql_where(&self, advice: &AdviceConfig, gpus: &str, filter: &str) -> String {
        let charge_max = charge_max_sql(true);
        let energy_price = num(self.kwh_usd * self.pue / 3.6e6);
        let limiter = limiter::argmax_sql(|c| {
            format!("sum(CASE WHEN limiter = '{c}' THEN secs ELSE 0.0 END)")
        });
        format!(
            r#"{ctes}
SELECT job_id, max(scheduler) AS scheduler, max(job_user) AS job_user, max(job_name) AS job_name, host,
  count(DISTINCT gpu_uuid) AS gpus, min(time) AS first_seen, max(time) AS last_seen,
  sum(secs) AS gpu_seconds, CASE WHEN sum(held) > 0 THEN sum(secs) / sum(held) ELSE 1.0 END AS share,
  sum(CASE WHEN idle THEN secs ELSE 0.0 END) AS idle_gpu_seconds,
  sum(joules) AS energy_joules,
  sum(secs * price) / 3600.0 + sum(joules) * {energy_price} AS cost_usd,
  sum(CASE WHEN idle THEN secs * price ELSE 0.0 END) / 3600.0 + sum(CASE WHEN idle THEN joules ELSE 0.0 END) * {energy_price} AS idle_cost_usd,
  {limiter} AS limiter, max(gpu_model) AS gpu_model,
  nullif(count(*) OVER (PARTITION BY job_id), 0) AS job_host_count,
  {activity} AS {MEAN_ACTIVITY}{charge_max}
FROM d GROUP BY job_id, host"#,
            activity = ledger::table::sample_mean_activity_sql(),
            ctes = self.sample_ctes(
                advice,
                &format!(", sm_active{}", charge_list_sql()),
                gpus,
                filter
            ),
        )
    }

    /// USD per joule of GPU energy (`kwh_usd × pue / 3.6e6`).
    pub(crate) fn energy_price(&self) -> f64 {
        self.kwh_usd * self.pue / 3.6e6
    }

    /// [`Self::energy_price`] as a SQL literal.
    pub(crate) fn energy_price_sql(&self) -> String {
        num(self.energy_price())
    }

    /// The `WITH s AS (..), …, d AS (..)` part shared by the `jobs` view and the job report: `d`
    /// has one row per job sample with `secs`, `joules` (the job's share of a shared GPU,
    /// [`shares::split_sql`]), `held` (the sample's whole seconds), `idle`, `price` (formulas
    /// above) and `limiter`, the sample's class ([`limiter::sample_class_sql`]).
    /// `extra` adds `gpu_metrics` columns to both (", col1, col2"), `gpus` filters `s` by whole
    /// GPUs (a condition on `host`/`gpu_uuid` only, so the window sums are unchanged) and
    /// `filter` adds a condition on `d`'s rows.
    pub(crate) fn sample_ctes(
        &self,
        advice: &AdviceConfig,
        extra: &str,
        gpus: &str,
        filter: &str,
    ) -> String {
        let gap = self.max_sample_gap().as_nanos();
        let idle = num(self.idle_utilization);
        let gpus_cond = gpus;
        let gpus = if gpus.is_empty() {
            String::new()
        } else {
            format!("\n  WHERE {gpus}")
        };
        let filter = if filter.is_empty() {
            String::new()
        } else {
            format!(" AND ({filter})")
        };
        let mut present = vec!["job_user", "job_name"];
        present.extend(extra.split(',').map(str::trim).filter(|c| !c.is_empty()));
        let source = format!(
            "gpu_metrics WHERE {}",
            if gpus_cond.is_empty() {
                "true"
            } else {
                gpus_cond
            }
        );
        format!(
            r#"WITH s AS (
  SELECT time, host, gpu_uuid, gpu_model, job_id, scheduler, job_user, job_name, gpu_utilization, energy_joules, job_shares{extra},
    {class} AS limiter,
    CAST(time AS BIGINT) - CAST(lag(time) OVER (PARTITION BY host, gpu_uuid ORDER BY time) AS BIGINT) AS dt_ns,
    energy_joules - lag(energy_joules) OVER (PARTITION BY host, gpu_uuid ORDER BY time) AS de
  FROM gpu_metrics{gpus}
), d0 AS (
  SELECT job_id, scheduler, job_user, job_name, host, gpu_uuid, gpu_model, time, gpu_utilization, job_shares{extra}, limiter,
    CASE WHEN dt_ns IS NULL OR dt_ns <= 0 THEN 0.0 WHEN dt_ns > {gap} THEN CAST({gap} AS DOUBLE) / 1e9 ELSE CAST(dt_ns AS DOUBLE) / 1e9 END AS secs,
    CASE WHEN de IS NULL THEN 0.0 WHEN de < 0 THEN energy_joules ELSE de END AS joules,
    COALESCE(gpu_utilization < {idle}, false) AS idle,
    {price} AS price
  FROM s WHERE job_id IS NOT NULL
), {split}"#,
            price = self.price_sql(),
            class = limiter::sample_class_sql(advice, self.idle_utilization),
            split = shares::split_sql(&present, &source, &filter),
        )
    }

    /// Registers the `jobs` view (its `limiter` classified with `jobs.advice`, its work counted
    /// from `jobs.work`) and the `budgets` table (`job_user`, `budget_usd`; a row with
    /// null `job_user` holds the default budget) in `ctx`. The view reads the returned ledger,
    /// which stays empty (the view then reads every raw sample) until [`JobLedger::run`] folds
    /// closed hours into it.
    pub async fn register(
        &self,
        ctx: &SessionContext,
        jobs: &JobsConfig,
    ) -> Result<Arc<JobLedger>> {
        self.validate()?;
        jobs.validate()?;
        declare_ledger_table().map_err(Error::Other)?;
        ledger::table::refresh_provider(ctx)
            .await
            .map_err(|e| Error::Other(format!("cannot register the job ledger's table: {e}")))?;
        let ledger = Arc::new(JobLedger::new(self.clone(), jobs.clone()));
        for (name, view) in [
            ("jobs", View::Jobs),
            ("job_hours", View::Hours),
            ("job_days", View::Days),
            ("spend_days", View::Spend),
            (ledger::groups::NAME, View::Groups),
        ] {
            let table = JobsTable::new(Arc::clone(&ledger), view, &ctx.state())
                .await
                .map_err(|e| Error::Other(format!("cannot plan the {name} view: {e}")))?;
            ctx.register_table(name, Arc::new(table))
                .map_err(|e| Error::Other(format!("cannot register the {name} view: {e}")))?;
        }

        self.register_budgets(ctx)?;
        Ok(ledger)
    }

    /// Registers `budgets` (`job_user`, `budget_usd`; a row with null `job_user` holds the
    /// default) and `group_budgets` (`scope`: `account` or `namespace`, `name`, `budget_usd`).
    fn register_budgets(&self, ctx: &SessionContext) -> Result<()> {
        let mut users: Vec<Option<String>> = self
            .user_budgets_usd
            .keys()
            .map(|u| Some(u.clone()))
            .collect();
        let mut budgets: Vec<f64> = self.user_budgets_usd.values().copied().collect();
        if let Some(d) = self.default_budget_usd {
            users.push(None);
            budgets.push(d);
        }
        register_memory(
            ctx,
            "budgets",
            vec![
                (
                    Field::new("job_user", DataType::Utf8, true),
                    Arc::new(StringArray::from(users)),
                ),
                (
                    Field::new("budget_usd", DataType::Float64, false),
                    Arc::new(Float64Array::from(budgets)),
                ),
            ],
        )?;
        let groups: Vec<(&str, &String, f64)> = [
            ("account", &self.account_budgets_usd),
            ("namespace", &self.namespace_budgets_usd),
        ]
        .into_iter()
        .flat_map(|(scope, m)| m.iter().map(move |(name, usd)| (scope, name, *usd)))
        .collect();
        register_memory(
            ctx,
            "group_budgets",
            vec![
                (
                    Field::new("scope", DataType::Utf8, false),
                    Arc::new(StringArray::from_iter_values(groups.iter().map(|g| g.0))),
                ),
                (
                    Field::new("name", DataType::Utf8, false),
                    Arc::new(StringArray::from_iter_values(
                        groups.iter().map(|g| g.1.as_str()),
                    )),
                ),
                (
                    Field::new("budget_usd", DataType::Float64, false),
                    Arc::new(Float64Array::from_iter_values(groups.iter().map(|g| g.2))),
                ),
            ],
        )
    }
}

/// Registers the one-batch table `name` of `columns` in `ctx`.
fn register_memory(
    ctx: &SessionContext,
    name: &str,
    columns: Vec<(Field, ArrayRef)>,
) -> Result<()> {
    let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = columns.into_iter().unzip();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(Arc::clone(&schema), arrays)
        .map_err(|e| Error::Other(e.to_string()))?;
    let table =
        MemTable::try_new(schema, vec![vec![batch]]).map_err(|e| Error::Other(e.to_string()))?;
    ctx.register_table(name, Arc::new(table))
        .map_err(|e| Error::Other(format!("cannot register the {name} table: {e}")))?;
    Ok(())
}

pub mod advice;
pub mod ledger;
pub mod limiter;
pub mod peaks;
pub mod report;
pub(crate) mod shares;
pub mod statement;
pub mod work;

pub use advice::{AdviceConfig, JobsConfig};
pub use ledger::table::declare as declare_ledger_table;
pub use ledger::{JobLedger, JobsTable, View};
pub use work::WorkConfig;

/// The `jobs` column of a job's mean activity on a host: the mean `sm_active` over its samples
/// that have it, else the mean `gpu_utilization` (a GPU without GPM counters); null when its
/// samples have neither.
pub(crate) const MEAN_ACTIVITY: &str = "mean_activity";

/// The chargeback label columns of `gpu_metrics` that the `jobs` view carries, after its other
/// columns and in this order: each is the largest value over the job's samples on the host (a
/// job's labels do not change while it runs; null when no sample had one).
pub(crate) const CHARGE_COLUMNS: [&str; 8] = [
    "job_account",
    "job_partition",
    "job_qos",
    "job_array_id",
    "job_array_task_id",
    "job_time_limit_seconds",
    "k8s_namespace",
    "job_labels",
];

/// Index of the one integer column of [`CHARGE_COLUMNS`].
pub(crate) const TIME_LIMIT_COLUMN: usize = 5;

/// A job's chargeback labels on one GPU ([`CHARGE_COLUMNS`]), each the largest value seen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Charge {
    /// The text columns in [`CHARGE_COLUMNS`] order (the time limit's slot unused).
    pub text: [Option<String>; CHARGE_COLUMNS.len()],
    /// `job_time_limit_seconds`.
    pub time_limit: Option<i64>,
}

impl Charge {
    /// Keeps the larger value of each label.
    pub fn merge(&mut self, other: &Charge) {
        for (slot, v) in self.text.iter_mut().zip(&other.text) {
            report::parts::keep_max(slot, v.as_deref());
        }
        self.time_limit = self.time_limit.max(other.time_limit);
    }

    /// The value of text column `column` of [`CHARGE_COLUMNS`].
    pub fn get(&self, column: &str) -> Option<&str> {
        let k = CHARGE_COLUMNS.iter().position(|c| *c == column)?;
        self.text[k].as_deref()
    }
}

/// `, job_account, job_partition, …`.
pub(crate) fn charge_list_sql() -> String {
    CHARGE_COLUMNS.iter().map(|c| format!(", {c}")).collect()
}

/// `, max(job_account) AS job_account, …` (`named`) or `, max(job_account), …`.
pub(crate) fn charge_max_sql(named: bool) -> String {
    CHARGE_COLUMNS
        .iter()
        .map(|c| {
            if named {
                format!(", max({c}) AS {c}")
            } else {
                format!(", max({c})")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
