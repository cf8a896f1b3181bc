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
use gpuwatch_store::ingest::remote_write::{DCGM_FIELDS, dcgm_label_set};
use gpuwatch_store::schema::LABEL_COLUMNS;
use promql_parser::label::{MatchOp, Matcher};

use crate::error::{Result, bad, exec};
use crate::labels::{Labels, NAME};

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

/// Counts the samples a query has loaded, against its limit.
#[derive(Debug)]
pub struct Budget {
    left: std::sync::atomic::AtomicI64,
    limit: usize,
    /// What the scans of the evaluation read and left out (damaged files).
    notes: Arc<ScanNotes>,
}

impl Budget {
    /// A budget of `limit` samples.
    pub fn new(limit: usize) -> Self {
        Self {
            left: std::sync::atomic::AtomicI64::new(i64::try_from(limit).unwrap_or(i64::MAX)),
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

/// A dcgm-exporter name that reads a `gpu_metrics` column.
#[derive(Debug, Clone, Copy)]
struct GpuName {
    name: &'static str,
    column: &'static str,
    /// Factor from the exporter's unit to the column's (divided out on read).
    scale: f64,
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

/// The dcgm-exporter names the `__name__` matchers accept.
fn gpu_names(matchers: &[Matcher]) -> Vec<GpuName> {
    let nm = name_matchers(matchers);
    let mut out: Vec<GpuName> = Vec::new();
    for f in DCGM_FIELDS {
        if out.iter().any(|g| g.name == f.name) {
            continue;
        }
        if nm.iter().all(|m| m.is_match(f.name)) {
            out.push(GpuName {
                name: f.name,
                column: f.column,
                scale: f.scale,
            });
        }
    }
    out
}

/// A SQL string literal.
pub(crate) fn sql_str(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn time_filter(min_ms: i64, max_ms: i64) -> String {
    format!("time >= to_timestamp_millis({min_ms}) AND time <= to_timestamp_millis({max_ms})")
}

/// Equality matchers that translate into a filter on a `gpu_metrics` label column: a series
/// with that label value always has that column value, and the column is the same in every row
/// of a GPU (so the rows that make its stale markers are all read; docs/promql.md).
fn gpu_pushdown(matchers: &[Matcher]) -> Vec<String> {
    let mut out = Vec::new();
    for m in matchers {
        if m.op != MatchOp::Equal || m.value.is_empty() {
            continue;
        }
        match m.name.as_str() {
            "Hostname" => out.push(format!("host = {}", sql_str(&m.value))),
            "UUID" => out.push(format!("gpu_uuid = {}", sql_str(&m.value))),
            "modelName" => out.push(format!("gpu_model = {}", sql_str(&m.value))),
            "gpu" => {
                if let Ok(i) = m.value.parse::<i32>() {
                    out.push(format!("gpu_index = {i}"));
                }
            }
            _ => {}
        }
    }
    out
}

/// Selects the series `matchers` accept with their samples in `[min_ms, max_ms]`.
pub async fn select(
    engine: &QueryEngine,
    matchers: &[Matcher],
    min_ms: i64,
    max_ms: i64,
    budget: &Budget,
) -> Result<Vec<RawSeries>> {
    check_selector(matchers)?;
    let mut out = Collector::default();
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

/// Series being built, keyed by label set, with the scrapes ("targets") they came from.
#[derive(Default)]
struct Collector {
    index: HashMap<Labels, usize>,
    series: Vec<RawSeries>,
    /// Per series, its target (an index into `target_times`), if it has one.
    target_of: Vec<Option<usize>>,
    targets: HashMap<String, usize>,
    /// Per target, the times at which it was scraped.
    target_times: Vec<Vec<i64>>,
    /// Per target, the scrape job it belongs to (`instance`, `job`), when known.
    target_job: Vec<Option<(String, String)>>,
    /// Only which series exist is wanted: one sample each is kept, none counted.
    labels_only: bool,
}

impl Collector {
    fn target(&mut self, key: &str, job: Option<(&str, &str)>) -> usize {
        if let Some(&t) = self.targets.get(key) {
            return t;
        }
        let t = self.target_times.len();
        self.targets.insert(key.to_string(), t);
        self.target_times.push(Vec::new());
        self.target_job.push(
            job.filter(|(i, j)| !i.is_empty() && !j.is_empty())
                .map(|(i, j)| (i.to_string(), j.to_string())),
        );
        t
    }

    /// Adds the failed scrapes (`up == 0`) of each scrape job to its targets' scrapes: Prometheus
    /// marks every series of a target stale when a scrape of it fails.
    async fn add_failed_scrapes(
        &mut self,
        engine: &QueryEngine,
        min_ms: i64,
        max_ms: i64,
        budget: &Budget,
    ) -> Result<()> {
        if self.target_job.iter().all(Option::is_none) {
            return Ok(());
        }
        let sql = format!(
            "SELECT time, labels FROM metrics WHERE metric = 'up' AND value = 0 AND {}",
            time_filter(min_ms, max_ms)
        );
        let mut failed: HashMap<(String, String), Vec<i64>> = HashMap::new();
        for b in run(engine, &sql, budget).await? {
            let t = times_ms(&b)?;
            let Some(map) = b.column(1).as_map_opt() else {
                continue;
            };
            for (i, &ti) in t.iter().enumerate() {
                let pairs = map_pairs(map, i)?;
                let get = |n: &str| {
                    pairs
                        .iter()
                        .find(|(k, _)| k == n)
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default()
                };
                failed
                    .entry((get("instance"), get("job")))
                    .or_default()
                    .push(ti);
            }
        }
        for (times, job) in self.target_times.iter_mut().zip(&self.target_job) {
            if let Some(f) = job.as_ref().and_then(|j| failed.get(j)) {
                times.extend_from_slice(f);
            }
        }
        Ok(())
    }

    fn slot(&mut self, labels: Labels, target: Option<usize>) -> usize {
        let next = self.series.len();
        *self.index.entry(labels.clone()).or_insert_with(|| {
            self.series.push(RawSeries {
                labels,
                ..RawSeries::default()
            });
            self.target_of.push(target);
            next
        })
    }

    /// Sorted samples per series (of two samples at one time the later written wins), and the
    /// stale markers Prometheus would have written: a series goes stale at the first later
    /// scrape of its target in which it has no sample.
    fn finish(mut self) -> Vec<RawSeries> {
        for times in &mut self.target_times {
            times.sort_unstable();
            times.dedup();
        }
        for (s, target) in self.series.iter_mut().zip(&self.target_of) {
            sort_samples(s);
            if let Some(t) = target {
                s.stale = stale_points(&s.t, &self.target_times[*t]);
            }
        }
        let mut out = self.series;
        out.sort_by(|a, b| a.labels.cmp(&b.labels));
        out
    }
}

fn sort_samples(s: &mut RawSeries) {
    if s.t.windows(2).all(|w| w[0] < w[1]) {
        return;
    }
    let mut pairs: Vec<(i64, f64)> = s.t.iter().copied().zip(s.v.iter().copied()).collect();
    pairs.sort_by_key(|p| p.0);
    let mut t = Vec::with_capacity(pairs.len());
    let mut v: Vec<f64> = Vec::with_capacity(pairs.len());
    for (pt, pv) in pairs {
        if t.last() == Some(&pt) {
            if let Some(last) = v.last_mut() {
                *last = pv;
            }
            continue;
        }
        t.push(pt);
        v.push(pv);
    }
    s.t = t;
    s.v = v;
}

/// The scrapes of `scrapes` (sorted) that came after a sample of `samples` (sorted) and before
/// its next one, the first of each such gap: where Prometheus writes a stale marker.
pub fn stale_points(samples: &[i64], scrapes: &[i64]) -> Vec<i64> {
    let mut out = Vec::new();
    let mut j = 0usize;
    let mut live = false;
    for &r in scrapes {
        while j < samples.len() && samples[j] < r {
            live = true;
            j += 1;
        }
        if j < samples.len() && samples[j] == r {
            live = true;
            j += 1;
            continue;
        }
        if live {
            out.push(r);
            live = false;
        }
    }
    out
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

/// The `series_labels` JSON object of a row: its (name, value) pairs.
fn parse_series_labels(text: &str) -> Result<Vec<(String, String)>> {
    let map: std::collections::BTreeMap<String, String> =
        serde_json::from_str(text).map_err(|e| {
            exec(format!(
                "gpu_metrics.series_labels is not a JSON object of strings: {e}"
            ))
        })?;
    Ok(map.into_iter().collect())
}

/// The (name, value) pairs of row `i` of a map column.
fn map_pairs(map: &MapArray, i: usize) -> Result<Vec<(String, String)>> {
    if map.is_null(i) {
        return Ok(Vec::new());
    }
    let entries = map.value(i);
    let keys = Text::of(entries.column(0))?;
    let values = Text::of(entries.column(1))?;
    Ok((0..entries.len())
        .filter_map(|j| {
            keys.get(j)
                .map(|k| (k.to_string(), values.get(j).unwrap_or_default().to_string()))
        })
        .collect())
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

/// `v` in the exporter's unit: divided by the ingest scale, snapped to a whole number when the
/// division only missed one by rounding (dcgm-exporter sends whole percents, MiB, mJ).
fn unscale(v: f64, scale: f64) -> f64 {
    if scale == 1.0 {
        return v;
    }
    let r = v / scale;
    let whole = r.round();
    if (r - whole).abs() <= whole.abs() * 1e-12 {
        whole
    } else {
        r
    }
}

async fn run(engine: &QueryEngine, sql: &str, budget: &Budget) -> Result<Vec<RecordBatch>> {
    let mut stream = engine.stream(sql, &budget.notes).await?;
    let mut out = Vec::new();
    while let Some(b) = stream.next().await {
        out.push(b.map_err(|e| gpuwatch_query::Error::from(e))?);
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
async fn scan_gpu(
    engine: &QueryEngine,
    matchers: &[Matcher],
    names: &[GpuName],
    min_ms: i64,
    max_ms: i64,
    budget: &Budget,
    out: &mut Collector,
) -> Result<()> {
    let mut columns: Vec<&str> = Vec::new();
    for n in names {
        if !columns.contains(&n.column) {
            columns.push(n.column);
        }
    }
    // The label columns the series' labels come from; the job's user, name and scheduler are not
    // among dcgm-exporter's labels, so they are not read.
    let labels: Vec<String> = LABEL_COLUMNS
        .iter()
        .map(|(c, _)| match *c {
            "job_user" | "job_name" | "scheduler" => format!("CAST(NULL AS VARCHAR) AS {c}"),
            c => c.to_string(),
        })
        .collect();
    // Every row of the selected GPUs, those without these columns too: they are scrapes in
    // which the series were absent (stale markers).
    let mut filters = vec![time_filter(min_ms, max_ms)];
    filters.extend(gpu_pushdown(matchers));
    let sql = format!(
        "SELECT time, {}, series_labels, {} FROM gpu_metrics WHERE {}",
        labels.join(", "),
        columns.join(", "),
        filters.join(" AND ")
    );
    for batch in run(engine, &sql, budget).await? {
        gpu_batch(&batch, matchers, names, &columns, budget, out)?;
    }
    Ok(())
}

/// The label-column cells of one row, as text (`gpu_index` too).
fn row_cells<'a>(
    cols: &'a [Text],
    index: &Int32Array,
    idx_text: &'a mut String,
    i: usize,
    gpu_index_col: usize,
) -> Vec<Option<&'a str>> {
    idx_text.clear();
    if !index.is_null(i) {
        idx_text.push_str(&index.value(i).to_string());
    }
    let mut cells: Vec<Option<&str>> = Vec::with_capacity(cols.len() + 1);
    for (c, col) in cols.iter().enumerate() {
        if c == gpu_index_col {
            cells.push((!index.is_null(i)).then_some(idx_text.as_str()));
        }
        cells.push(col.get(i));
    }
    if gpu_index_col >= cols.len() {
        cells.push((!index.is_null(i)).then_some(idx_text.as_str()));
    }
    cells
}

/// The label columns of one `gpu_metrics` batch.
struct GpuLabels {
    /// Every label column but `gpu_index`, as text, in `LABEL_COLUMNS` order.
    text: Vec<Text>,
    /// `gpu_index`.
    index: Int32Array,
    /// Where `gpu_index` sits in `LABEL_COLUMNS`.
    index_pos: usize,
    /// `series_labels` (a row's label overrides), when the scan has it.
    extra: Option<Text>,
}

impl GpuLabels {
    /// Reads the label columns of `batch`; an error when one is missing.
    fn read(batch: &RecordBatch) -> Result<Self> {
        let index_pos = LABEL_COLUMNS
            .iter()
            .position(|(c, _)| *c == "gpu_index")
            .ok_or_else(|| exec("gpu_metrics has no gpu_index column"))?;
        let mut text: Vec<Text> = Vec::with_capacity(LABEL_COLUMNS.len());
        let mut index: Option<Int32Array> = None;
        for (c, _) in LABEL_COLUMNS {
            let a = batch
                .column_by_name(c)
                .ok_or_else(|| exec(format!("gpu_metrics scan lacks {c}")))?;
            if *c == "gpu_index" {
                index = Some(
                    arrow::compute::cast(a, &DataType::Int32)?
                        .as_primitive::<Int32Type>()
                        .clone(),
                );
            } else {
                text.push(Text::of(a)?);
            }
        }
        let index = index.ok_or_else(|| exec("gpu_metrics scan lacks gpu_index"))?;
        let extra = match batch.column_by_name("series_labels") {
            Some(a) => Some(Text::of(a)?),
            None => None,
        };
        Ok(Self {
            text,
            index,
            index_pos,
            extra,
        })
    }

    /// Whether rows `i` and `j` have the same label cells, and so the same series.
    fn same(&self, i: usize, j: usize) -> bool {
        self.index.is_null(i) == self.index.is_null(j)
            && self.index.value(i) == self.index.value(j)
            && self.text.iter().all(|c| c.same(i, j))
            && self.extra.as_ref().is_none_or(|m| m.same(i, j))
    }

    /// Row `i`'s labels without the metric name, and the key of the scrape it belongs to.
    fn row(&self, i: usize, idx_text: &mut String) -> Result<(Labels, String)> {
        let cells = row_cells(&self.text, &self.index, idx_text, i, self.index_pos);
        let extra = match self.extra.as_ref().and_then(|c| c.get(i)) {
            Some(text) => parse_series_labels(text)?,
            None => Vec::new(),
        };
        let base = series_labels(&cells, &extra);
        let key = gpu_target_key(&cells, &base);
        Ok((base, key))
    }
}

/// Per selected name, its value column of `batch` read as doubles.
fn name_values(
    batch: &RecordBatch,
    names: &[GpuName],
    columns: &[&str],
) -> Result<Vec<Float64Array>> {
    let values: Vec<Float64Array> = columns
        .iter()
        .map(|c| {
            batch
                .column_by_name(c)
                .ok_or_else(|| exec(format!("gpu_metrics scan lacks {c}")))
                .and_then(values_f64)
        })
        .collect::<Result<_>>()?;
    Ok(names
        .iter()
        .map(|g| {
            let at = columns.iter().position(|c| *c == g.column).unwrap_or(0);
            values[at].clone()
        })
        .collect())
}

/// Adds row `i`'s values (taken at `t`) to the series in `slots`, one per selected name.
fn push_row(
    out: &mut Collector,
    names: &[GpuName],
    slots: &[Option<usize>],
    values: &[Float64Array],
    i: usize,
    t: i64,
) {
    for (j, g) in names.iter().enumerate() {
        let Some(slot) = slots[j] else { continue };
        let col = &values[j];
        if col.is_null(i) {
            continue;
        }
        let s = &mut out.series[slot];
        if out.labels_only && !s.t.is_empty() {
            continue;
        }
        s.t.push(t);
        s.v.push(unscale(col.value(i), g.scale));
    }
}

/// Turns one batch of a `gpu_metrics` scan into samples of the series the matchers select,
/// and records the times its targets were scraped.
fn gpu_batch(
    batch: &RecordBatch,
    matchers: &[Matcher],
    names: &[GpuName],
    columns: &[&str],
    budget: &Budget,
    out: &mut Collector,
) -> Result<()> {
    let n = batch.num_rows();
    let t = times_ms(batch)?;
    let cols = GpuLabels::read(batch)?;
    let values = name_values(batch, names, columns)?;
    if !out.labels_only {
        budget.take(n * names.len().min(2))?;
    }
    // Rows of one GPU come in runs (files are sorted by host, GPU, time): a row's series are
    // looked up again only when its label cells differ from the previous row's.
    let mut prev_slots: Vec<Option<usize>> = vec![None; names.len()];
    let mut prev_target = 0usize;
    let mut idx_text = String::new();
    for i in 0..n {
        if i == 0 || !cols.same(i, i - 1) {
            let (base, key) = cols.row(i, &mut idx_text)?;
            prev_target = out.target(&key, Some((base.get("instance"), base.get("job"))));
            for (j, g) in names.iter().enumerate() {
                let labels = base.with(NAME, g.name);
                prev_slots[j] =
                    matches(matchers, &labels).then(|| out.slot(labels, Some(prev_target)));
            }
        }
        if !out.labels_only {
            out.target_times[prev_target].push(t[i]);
        }
        push_row(out, names, &prev_slots, &values, i, t[i]);
    }
    Ok(())
}

/// The scrape a `gpu_metrics` row belongs to: its GPU (host, UUID, MIG instance) as scraped
/// from one target (`instance`, `job`).
fn gpu_target_key(cells: &[Option<&str>], labels: &Labels) -> String {
    let col = |name: &str| {
        LABEL_COLUMNS
            .iter()
            .position(|(c, _)| *c == name)
            .and_then(|i| cells.get(i).copied().flatten())
            .unwrap_or_default()
    };
    format!(
        "{}\u{1}{}\u{1}{}\u{1}{}\u{1}{}",
        col("host"),
        col("gpu_uuid"),
        col("mig_instance"),
        labels.get("instance"),
        labels.get("job")
    )
}

/// The label set of a `gpu_metrics` row: dcgm-exporter's labels of its columns with the row's
/// overrides applied.
fn series_labels(cells: &[Option<&str>], extra: &[(String, String)]) -> Labels {
    let mut pairs: Vec<(String, String)> = dcgm_label_set(cells)
        .into_iter()
        .filter(|(n, _)| !extra.iter().any(|(e, _)| e == n))
        .map(|(n, v)| (n.to_string(), v))
        .collect();
    pairs.extend(extra.iter().cloned());
    Labels::new(pairs)
}

async fn metric_names(
    engine: &QueryEngine,
    matchers: &[Matcher],
    min_ms: i64,
    max_ms: i64,
    budget: &Budget,
) -> Result<Vec<String>> {
    let nm = name_matchers(matchers);
    if let Some(m) = nm.iter().find(|m| m.op == MatchOp::Equal) {
        return Ok(vec![m.value.clone()]);
    }
    let sql = format!(
        "SELECT DISTINCT metric FROM metrics WHERE {}",
        time_filter(min_ms, max_ms)
    );
    let mut out = Vec::new();
    for b in run(engine, &sql, budget).await? {
        let names = Text::of(b.column(0))?;
        for i in 0..b.num_rows() {
            if let Some(n) = names.get(i)
                && nm.iter().all(|m| m.is_match(n))
            {
                out.push(n.to_string());
            }
        }
    }
    Ok(out)
}

async fn scan_metrics(
    engine: &QueryEngine,
    matchers: &[Matcher],
    min_ms: i64,
    max_ms: i64,
    budget: &Budget,
    out: &mut Collector,
) -> Result<()> {
    let names = metric_names(engine, matchers, min_ms, max_ms, budget).await?;
    if names.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = names.iter().map(|n| sql_str(n)).collect();
    let sql = format!(
        "SELECT time, metric, value, labels FROM metrics WHERE metric IN ({}) AND {}",
        list.join(", "),
        time_filter(min_ms, max_ms)
    );
    for batch in run(engine, &sql, budget).await? {
        let n = batch.num_rows();
        if !out.labels_only {
            budget.take(n)?;
        }
        let t = times_ms(&batch)?;
        let metric = Text::of(batch.column(1))?;
        let value = values_f64(batch.column(2))?;
        let map = batch.column(3).as_map_opt().cloned();
        type Prev = (String, Vec<(String, String)>, Option<usize>, Option<usize>);
        let mut prev: Option<Prev> = None;
        for i in 0..n {
            let name = metric.get(i).unwrap_or_default();
            let pairs = match &map {
                Some(m) => map_pairs(m, i)?,
                None => Vec::new(),
            };
            let (slot, target) = match &prev {
                Some((pn, pl, slot, target)) if pn == name && *pl == pairs => (*slot, *target),
                _ => {
                    let mut all = pairs.clone();
                    all.push((NAME.to_string(), name.to_string()));
                    let labels = Labels::new(all);
                    // A scraped series (with `instance` and `job`) is one of its metric's on
                    // that target; others have no target and go stale by lookback only.
                    let (inst, job) = (labels.get("instance"), labels.get("job"));
                    let target = (!inst.is_empty() && !job.is_empty()).then(|| {
                        out.target(&format!("{name}\u{1}{inst}\u{1}{job}"), Some((inst, job)))
                    });
                    let slot = matches(matchers, &labels).then(|| out.slot(labels, target));
                    prev = Some((name.to_string(), pairs, slot, target));
                    (slot, target)
                }
            };
            if let Some(tg) = target.filter(|_| !out.labels_only) {
                out.target_times[tg].push(t[i]);
            }
            let Some(slot) = slot else { continue };
            if value.is_null(i) {
                continue;
            }
            let s = &mut out.series[slot];
            if out.labels_only && !s.t.is_empty() {
                continue;
            }
            s.t.push(t[i]);
            s.v.push(value.value(i));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_goes_stale_at_the_first_scrape_without_it() {
        // Scraped every second; the series was in the scrapes of 1, 2 and 5 only.
        let scrapes = [1, 2, 3, 4, 5, 6];
        assert_eq!(stale_points(&[1, 2, 5], &scrapes), vec![3, 6]);
        // Present in every scrape: never stale.
        assert_eq!(
            stale_points(&[1, 2, 3, 4, 5, 6], &scrapes),
            Vec::<i64>::new()
        );
        // Scrapes before its first sample do not make it stale.
        assert_eq!(stale_points(&[4], &scrapes), vec![5]);
        assert_eq!(stale_points(&[], &scrapes), Vec::<i64>::new());
    }

    #[test]
    fn units_come_back_whole() {
        assert_eq!(unscale(0.97, 0.01), 97.0);
        assert_eq!(unscale(0.29, 0.01), 29.0);
        assert_eq!(unscale(49_850.753, 0.001), 49_850_753.0);
        assert_eq!(unscale(2048.0 * 1_048_576.0, 1_048_576.0), 2048.0);
        assert_eq!(unscale(0.5, 1.0), 0.5);
    }

    #[test]
    fn selectors_that_match_everything_are_refused() {
        let empty = vec![Matcher::new(MatchOp::Equal, "gpu", "")];
        assert!(check_selector(&empty).is_err());
        let named = all_matchers(Some("up"), &[]);
        assert!(check_selector(&named).is_ok());
    }
}
