//! Series selection: a PromQL selector's matchers and time range become one SQL scan per table
//! (time range, metric name and label equalities pushed down), and the rows become series.
//!
//! dcgm-exporter's names (`DCGM_FI_*`, the remote-write table
//! [`gpuwatch_store::ingest::remote_write::DCGM_FIELDS`]) read the matching `gpu_metrics`
//! column, their units converted back (ratio → percent, bytes → MiB, J → mJ). A row's series
//! carries dcgm-exporter's label set of its label columns
//! ([`gpuwatch_store::ingest::remote_write::dcgm_label_set`]) with the row's `series_labels`
//! (how a remote-written series differed from it) applied. Every name is also looked up in
//! `metrics`, whose rows carry their `labels` map as the label set.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, Int32Array, Int64Array, MapArray, RecordBatch,
};
use arrow::datatypes::{DataType, Float64Type, Int32Type, Int64Type, TimestampNanosecondType};
use futures::StreamExt;
use gpuwatch_query::QueryEngine;
use gpuwatch_query::skipped::ScanNotes;
use gpuwatch_store::ingest::remote_write::{DCGM_FIELDS, DCGM_LABEL_COLUMNS, dcgm_label_set};
use gpuwatch_store::schema::LABEL_COLUMNS;
use promql_parser::label::{MatchOp, Matcher};

use crate::error::{Result, bad, exec};
use crate::labels::{Labels, NAME};

mod collect;
mod gpu;
mod metrics;
mod steps;

use collect::Collector;
pub use collect::stale_points;
use gpu::{gpu_names, scan_gpu};
use metrics::{map_pairs, scan_metrics};
pub use steps::Steps;

/// One series' samples, oldest first, times in milliseconds.
#[derive(Debug, Clone, Default)]
pub struct RawSeries {
    /// The series' labels, `__name__` among them.
    pub labels: Labels,
    /// Sample times (ms), ascending.
    pub t: Vec<i64>,
    /// Sample values.
    pub v: Vec<f64>,
    /// Times (ms, ascending) at which the series went stale: its scrape went on without it
    /// (see [`Collector::finish`]).
    pub stale: Vec<i64>,
}

/// Counts the samples a query has loaded, against its limit (clones share the count).
#[derive(Debug, Clone)]
pub struct Budget {
    left: Arc<std::sync::atomic::AtomicI64>,
    limit: usize,
    /// What the scans of the evaluation read and left out (damaged files).
    notes: Arc<ScanNotes>,
}

impl Budget {
    /// A budget of `limit` samples.
    pub fn new(limit: usize) -> Self {
        Self {
            left: Arc::new(std::sync::atomic::AtomicI64::new(
                i64::try_from(limit).unwrap_or(i64::MAX),
            )),
            limit,
            notes: Arc::default(),
        }
    }

    /// The warnings of the evaluation's scans so far: files left out as damaged.
    pub fn warnings(&self) -> Vec<String> {
        self.notes.warnings()
    }

    /// Takes `n` samples from the budget.
    pub fn take(&self, n: usize) -> Result<()> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let before = self.left.fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
        if before < n {
            return Err(exec(format!(
                "query processing would load too many samples into memory (more than {}): narrow the selection or the time range, or raise --promql-max-samples",
                self.limit
            )));
        }
        Ok(())
    }
}

/// The matchers of a selector, `__name__` included (from the name before the braces too).
pub fn all_matchers(name: Option<&str>, matchers: &[Matcher]) -> Vec<Matcher> {
    let mut out: Vec<Matcher> = matchers.to_vec();
    if let Some(n) = name
        && !out
            .iter()
            .any(|m| m.name == NAME && m.op == MatchOp::Equal && m.value == n)
    {
        out.push(Matcher::new(MatchOp::Equal, NAME, n));
    }
    out
}

/// True when every matcher matches `labels` (an absent label matches as the empty string).
pub fn matches(matchers: &[Matcher], labels: &Labels) -> bool {
    matchers.iter().all(|m| m.is_match(labels.get(&m.name)))
}

fn name_matchers(matchers: &[Matcher]) -> Vec<&Matcher> {
    matchers.iter().filter(|m| m.name == NAME).collect()
}

/// A SQL string literal.
pub(crate) fn sql_str(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn time_filter(min_ms: i64, max_ms: i64) -> String {
    format!("time >= to_timestamp_millis({min_ms}) AND time <= to_timestamp_millis({max_ms})")
}

/// Selects the series `matchers` accept with their samples in `[min_ms, max_ms]`; with `steps`
/// (an instant selector's), only the samples those steps can read.
pub async fn select(
    engine: &QueryEngine,
    matchers: &[Matcher],
    min_ms: i64,
    max_ms: i64,
    budget: &Budget,
    steps: Option<Steps>,
) -> Result<Vec<RawSeries>> {
    check_selector(matchers)?;
    let mut out = Collector {
        steps,
        ..Collector::default()
    };
    collect(engine, matchers, min_ms, max_ms, budget, &mut out).await?;
    out.add_failed_scrapes(engine, min_ms, max_ms, budget)
        .await?;
    Ok(out.finish())
}

async fn collect(
    engine: &QueryEngine,
    matchers: &[Matcher],
    min_ms: i64,
    max_ms: i64,
    budget: &Budget,
    out: &mut Collector,
) -> Result<()> {
    let names = gpu_names(matchers);
    if !names.is_empty() {
        scan_gpu(engine, matchers, &names, min_ms, max_ms, budget, out).await?;
    }
    scan_metrics(engine, matchers, min_ms, max_ms, budget, out).await
}

/// Only the label sets of the series `matchers` accept with samples in `[min_ms, max_ms]`.
pub async fn select_labels(
    engine: &QueryEngine,
    matchers: &[Matcher],
    min_ms: i64,
    max_ms: i64,
    budget: &Budget,
) -> Result<Vec<Labels>> {
    check_selector(matchers)?;
    // Samples are not kept (one per series says it exists) and not counted against the budget.
    let mut out = Collector {
        labels_only: true,
        ..Collector::default()
    };
    collect(engine, matchers, min_ms, max_ms, budget, &mut out).await?;
    Ok(out.series.into_iter().map(|s| s.labels).collect())
}

/// Prometheus refuses selectors that match everything (`{}`, `{a=""}`, `{a=~".*"}`).
pub fn check_selector(matchers: &[Matcher]) -> Result<()> {
    if matchers.iter().all(|m| m.is_match("")) {
        return Err(bad(
            "vector selector must contain at least one non-empty matcher",
        ));
    }
    Ok(())
}

/// A column of text in whatever string type the scan gave.
enum Text {
    Plain(arrow::array::StringArray),
    View(arrow::array::StringViewArray),
}

impl Text {
    fn of(a: &ArrayRef) -> Result<Text> {
        Ok(match a.data_type() {
            DataType::Utf8View => Text::View(a.as_string_view().clone()),
            DataType::Utf8 => Text::Plain(a.as_string::<i32>().clone()),
            _ => Text::View(
                arrow::compute::cast(a, &DataType::Utf8View)?
                    .as_string_view()
                    .clone(),
            ),
        })
    }

    fn get(&self, i: usize) -> Option<&str> {
        match self {
            Text::Plain(a) => (!a.is_null(i)).then(|| a.value(i)),
            Text::View(a) => (!a.is_null(i)).then(|| a.value(i)),
        }
    }

    /// True when rows `i` and `j` hold the same text (or are both null). Views that are equal
    /// bit for bit (a dictionary page's value decoded twice) need no string comparison.
    fn same(&self, i: usize, j: usize) -> bool {
        if let Text::View(a) = self
            && a.views()[i] == a.views()[j]
            && a.is_null(i) == a.is_null(j)
        {
            return true;
        }
        self.get(i) == self.get(j)
    }
}

fn times_ms(batch: &RecordBatch) -> Result<Vec<i64>> {
    let c = batch
        .column_by_name("time")
        .ok_or_else(|| exec("the scan has no time column"))?;
    let ns = arrow::compute::cast(
        c,
        &DataType::Timestamp(arrow::datatypes::TimeUnit::Nanosecond, None),
    )?;
    Ok(ns
        .as_primitive::<TimestampNanosecondType>()
        .values()
        .iter()
        .map(|t| t.div_euclid(1_000_000))
        .collect())
}

/// A value column read as doubles.
fn values_f64(a: &ArrayRef) -> Result<Float64Array> {
    Ok(match a.data_type() {
        DataType::Float64 => a.as_primitive::<Float64Type>().clone(),
        DataType::Int64 => {
            let i: &Int64Array = a.as_primitive::<Int64Type>();
            i.unary(|x| x as f64)
        }
        _ => arrow::compute::cast(a, &DataType::Float64)?
            .as_primitive::<Float64Type>()
            .clone(),
    })
}

/// The batches of `sql` (small answers: metric names, failed scrapes; selections go through
/// [`scan_parts`]).
async fn run(engine: &QueryEngine, sql: &str, budget: &Budget) -> Result<Vec<RecordBatch>> {
    let mut stream = engine.stream(sql, &budget.notes).await?;
    let mut out = Vec::new();
    while let Some(b) = stream.next().await {
        out.push(b.map_err(gpuwatch_query::Error::from)?);
    }
    Ok(out)
}

/// Runs `sql` with each partition of its plan (a share of the files) read by its own task into
/// its own collector (`part` turns a batch into samples), and merges them into `out` in
/// partition order. The tasks end with the evaluation: dropping it aborts them.
async fn scan_parts<F>(
    engine: &QueryEngine,
    sql: &str,
    budget: &Budget,
    out: &mut Collector,
    part: F,
) -> Result<()>
where
    F: Fn(&RecordBatch, &mut Collector) -> Result<()> + Send + Sync + 'static,
{
    let streams = engine.stream_partitions(sql, &budget.notes).await?;
    let part = Arc::new(part);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, mut stream) in streams.into_iter().enumerate() {
        let part = Arc::clone(&part);
        let mut c = Collector {
            labels_only: out.labels_only,
            steps: out.steps,
            ..Collector::default()
        };
        tasks.spawn(async move {
            while let Some(b) = stream.next().await {
                part(&b.map_err(gpuwatch_query::Error::from)?, &mut c)?;
            }
            Ok::<_, crate::error::Error>((i, c))
        });
    }
    let mut parts = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let done = done.map_err(|e| exec(format!("a scan task failed: {e}")))?;
        parts.push(done?);
    }
    parts.sort_by_key(|(i, _)| *i);
    for (_, c) in parts {
        out.absorb(c);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_that_match_everything_are_refused() {
        let empty = vec![Matcher::new(MatchOp::Equal, "gpu", "")];
        assert!(check_selector(&empty).is_err());
        let named = all_matchers(Some("up"), &[]);
        assert!(check_selector(&named).is_ok());
    }
}
