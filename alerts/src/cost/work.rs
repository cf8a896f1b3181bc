//! Work done, as the job itself counts it: the `[jobs.work]` section and the SQL that turns a
//! job's OpenTelemetry counters (`job.samples`, `job.tokens`, `job.steps`, and the counters the
//! site names) into the `jobs` view's `work_*` columns (formulas in docs/cost.md, "Work done").
//!
//! A training or inference program sends its counters to the server's OTLP endpoint with the
//! resource attribute `job.id`; they land in `metrics` (`metric`, `value`, `labels`). Each series
//! (one label set: one process, or one rank) is a cumulative counter that starts at zero when the
//! process starts, as the OpenTelemetry SDKs send counters by default:
//!
//! ```text
//! work of a series = its first value + Σ increases + the value after each reset (a decrease)
//! work of a job    = Σ over its series of its unit's counter
//! unit of a job    = the first counter it reports, in the order: [jobs.work] counters, then
//!                    job.samples, job.tokens, job.steps
//! ```
//!
//! The `jobs` view has one row per job and host, and the counters say nothing about hosts: each
//! row gets the job's work in proportion to its GPU-seconds, so the rows of a job add up to the
//! job's work and every row prices it at the job's own USD per unit.

use serde::Deserialize;

use super::sql_str;
use crate::error::{Error, Result};

/// The counters every job may report, in order of preference after the configured ones.
pub const STANDARD_COUNTERS: [&str; 3] = ["job.samples", "job.tokens", "job.steps"];

/// The columns the views take from the job's counters: a view asked for none of them does not
/// read the counters.
pub(crate) const WORK_COLUMNS: [&str; 5] = [
    "work_unit",
    "work_done",
    "work_per_second",
    "work_per_gpu_hour",
    "usd_per_million_units",
];

/// The resource (or point) attribute that names the job a counter belongs to.
pub const JOB_ID_ATTRIBUTE: &str = "job.id";

/// The `[jobs.work]` section.
///
/// ```toml
/// [jobs.work]
/// counters = ["train.images"]   # preferred over job.samples, job.tokens and job.steps
/// ```
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkConfig {
    /// Counters that count a job's work besides `job.samples`, `job.tokens` and `job.steps`,
    /// preferred over them in this order when a job reports several [default: none].
    pub counters: Vec<String>,
}

impl WorkConfig {
    /// Checks the names.
    pub fn validate(&self) -> Result<()> {
        for c in &self.counters {
            if c.trim().is_empty() || c.len() > 255 || c.chars().any(char::is_control) {
                return Err(Error::Config(format!(
                    "jobs.work.counters: {c:?} is not a metric name: write the name the program's counter has, e.g. \"train.images\""
                )));
            }
        }
        Ok(())
    }

    /// Every work counter, the most preferred first, without repeats.
    pub fn counters(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for c in self
            .counters
            .iter()
            .map(String::as_str)
            .chain(STANDARD_COUNTERS)
        {
            if !out.iter().any(|o| o == c) {
                out.push(c.to_string());
            }
        }
        out
    }

    /// `WITH` parts ending in `w` (`job_id`, `work_unit`, `work`): one row per job that reported
    /// work, its preferred counter and the work it counted. `job_filter` is a condition on
    /// `job_id` (empty for every job).
    pub(crate) fn work_ctes(&self, job_filter: &str) -> String {
        let counters = self.counters();
        let names: Vec<String> = counters.iter().map(|c| sql_str(c)).collect();
        let rank: String = names
            .iter()
            .enumerate()
            .map(|(i, n)| format!(" WHEN {n} THEN {i}"))
            .collect();
        let id = sql_str(JOB_ID_ATTRIBUTE);
        let filter = if job_filter.is_empty() {
            String::new()
        } else {
            format!(" AND ({job_filter})")
        };
        format!(
            r#"wp AS (
  SELECT job_id, metric, time, value, series FROM (
    SELECT labels[{id}] AS job_id, metric, time, value,
      array_to_string(map_keys(labels), chr(31)) || chr(30) || array_to_string(map_values(labels), chr(31)) AS series
    FROM metrics WHERE metric IN ({names}) AND value IS NOT NULL AND value >= 0
  ) x WHERE job_id IS NOT NULL{filter}
), wd AS (
  SELECT job_id, metric, value, value - lag(value) OVER (PARTITION BY metric, series ORDER BY time) AS dv FROM wp
), wj AS (
  SELECT job_id, metric, sum(CASE WHEN dv IS NULL OR dv < 0 THEN value ELSE dv END) AS work FROM wd GROUP BY job_id, metric
), w AS (
  SELECT job_id, metric AS work_unit, work FROM (
    SELECT job_id, metric, work, row_number() OVER (PARTITION BY job_id ORDER BY CASE metric{rank} END) AS pick FROM wj
  ) r WHERE pick = 1
)"#,
            names = names.join(", "),
        )
    }

    /// `WITH j AS (core), …, jw AS (…)`: `core`'s rows (one job may have several) with
    /// `work_unit` and `work_done`, the job's work split by the rows' GPU-seconds (evenly when
    /// the job has none). The job's sums are a window over the rows of the jobs with work
    /// only: the rows of the others share one partition (a window of a partition per job
    /// took 1.5 s over a month of 10,000 GPUs' job days, whatever the work reported).
    fn work_split(&self, core: &str) -> String {
        format!(
            r#"WITH j AS (
{core}
), {work}, jk AS (
  SELECT j.*, w.work_unit, w.work, CASE WHEN w.job_id IS NOT NULL THEN j.job_id END AS work_job
  FROM j LEFT JOIN w ON w.job_id = j.job_id
), jt AS (
  SELECT jk.*, sum(gpu_seconds) OVER (PARTITION BY work_job) AS job_gpu_seconds, count(*) OVER (PARTITION BY work_job) AS job_rows FROM jk
), jw AS (
  SELECT jt.*, work * CASE WHEN job_gpu_seconds > 0 THEN gpu_seconds / job_gpu_seconds ELSE 1.0 / job_rows END AS work_done
  FROM jt
)"#,
            work = self.work_ctes(""),
        )
    }

    /// The `jobs` view's statement: `core` (a statement with one row per job and host) with
    /// the work columns added: `gpu_model` and `job_host_count` are kept, then `work_unit`, `work_done`,
    /// `work_per_second` (over the row's first to last sample), `work_per_gpu_hour` and
    /// `usd_per_million_units`.
    pub(crate) fn jobs_with_work(&self, core: &str) -> String {
        format!(
            r#"{split}
SELECT job_id, scheduler, job_user, job_name, host, gpus, first_seen, last_seen, gpu_seconds, share, idle_gpu_seconds,
  energy_joules, cost_usd, idle_cost_usd, limiter, gpu_model, job_host_count, {activity}, work_unit, work_done,
  CASE WHEN last_seen > first_seen THEN work_done / (CAST(CAST(last_seen AS BIGINT) - CAST(first_seen AS BIGINT) AS DOUBLE) / 1e9) END AS work_per_second,
  CASE WHEN gpu_seconds > 0 THEN work_done / (gpu_seconds / 3600.0) END AS work_per_gpu_hour,
  CASE WHEN work_done > 0 THEN cost_usd / work_done * 1e6 END AS usd_per_million_units{charge}
FROM jw"#,
            split = self.work_split(core),
            activity = super::MEAN_ACTIVITY,
            charge = super::charge_list_sql(),
        )
    }

    /// The `job_hours` and `job_days` views' statement: `core` (one row per job, host, GPU
    /// model and `period`, `hour` or `day`) with `work_unit` and `work_done` (the job's work
    /// split by GPU-seconds, so that a job's hours or days add up to its rows of `jobs`).
    pub(crate) fn rows_with_work(&self, core: &str, period: &str) -> String {
        format!(
            r#"{split}
SELECT {period}, job_id, scheduler, job_user, job_name, host, gpu_model, gpus, first_seen, last_seen, gpu_seconds,
  share, idle_gpu_seconds, energy_joules, cost_usd, idle_cost_usd, work_unit, work_done{charge}
FROM jw"#,
            split = self.work_split(core),
            charge = super::charge_list_sql(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configured_counters_come_first_without_repeats_and_bad_names_are_refused() {
        let w: WorkConfig =
            toml::from_str("counters = [\"train.images\", \"job.tokens\"]\n").expect("parse");
        assert_eq!(
            w.counters(),
            ["train.images", "job.tokens", "job.samples", "job.steps"]
        );
        assert!(w.validate().is_ok());
        assert_eq!(WorkConfig::default().counters(), STANDARD_COUNTERS);
        let bad = WorkConfig {
            counters: vec![" ".into()],
        };
        let e = bad.validate().expect_err("blank").to_string();
        assert!(e.contains("jobs.work.counters"), "{e}");
        assert!(toml::from_str::<WorkConfig>("countres = []\n").is_err());
    }
}
