//! `gpu_metrics` rows as dcgm-exporter's series: the label columns' runs, the value columns in
//! the exporter's units.

use super::steps::read;
use super::*;

/// A dcgm-exporter name that reads a `gpu_metrics` column.
#[derive(Debug, Clone, Copy)]
pub(super) struct GpuName {
    name: &'static str,
    column: &'static str,
    /// Factor from the exporter's unit to the column's (divided out on read).
    scale: f64,
}

/// The dcgm-exporter names the `__name__` matchers accept.
pub(super) fn gpu_names(matchers: &[Matcher]) -> Vec<GpuName> {
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

/// Equality matchers that translate into a filter on a `gpu_metrics` label column: a series
/// with that label value always has that column value, and the column is the same in every row
/// of a GPU (so the rows that make its stale markers are all read; docs/promql.md).
pub(super) fn gpu_pushdown(matchers: &[Matcher]) -> Vec<String> {
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

/// The `series_labels` JSON object of a row: its (name, value) pairs.
pub(super) fn parse_series_labels(text: &str) -> Result<Vec<(String, String)>> {
    let map: std::collections::BTreeMap<String, String> =
        serde_json::from_str(text).map_err(|e| {
            exec(format!(
                "gpu_metrics.series_labels is not a JSON object of strings: {e}"
            ))
        })?;
    Ok(map.into_iter().collect())
}

/// `v` in the exporter's unit: divided by the ingest scale, snapped to a whole number when the
/// division only missed one by rounding (dcgm-exporter sends whole percents, MiB, mJ).
pub(super) fn unscale(v: f64, scale: f64) -> f64 {
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

#[allow(clippy::too_many_arguments)]
pub(super) async fn scan_gpu(
    engine: &QueryEngine,
    matchers: &[Matcher],
    names: &[GpuName],
    min_ms: i64,
    max_ms: i64,
    budget: &Budget,
    out: &mut Collector,
) -> Result<()> {
    let mut columns: Vec<&'static str> = Vec::new();
    for n in names {
        if !columns.contains(&n.column) {
            columns.push(n.column);
        }
    }
    // Only the label columns the series' labels come from: the others (the job's user, account,
    // labels, …) are not among dcgm-exporter's labels.
    let labels: Vec<&str> = DCGM_LABEL_COLUMNS.to_vec();
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
    let (matchers, names) = (matchers.to_vec(), names.to_vec());
    let b = budget.clone();
    scan_parts(engine, &sql, budget, out, move |batch, part| {
        gpu_batch(batch, &matchers, &names, &columns, &b, part)
    })
    .await
}

/// The label columns of one `gpu_metrics` batch, and the runs of rows that share them.
pub(super) struct GpuLabels {
    /// Per column of `LABEL_COLUMNS` (`gpu_index` excluded, as `None`), its text, when the scan
    /// read it.
    text: Vec<Option<Text>>,
    /// `gpu_index`.
    index: Int32Array,
    /// Where `gpu_index` sits in `LABEL_COLUMNS`.
    index_pos: usize,
    /// `series_labels` (a row's label overrides), when the scan has it.
    extra: Option<Text>,
    /// Runs of consecutive rows with the same label cells (the same series), as row ranges.
    runs: Vec<std::ops::Range<usize>>,
}

impl GpuLabels {
    /// Reads the label columns of `batch` that [`dcgm_label_set`] needs; an error when one is
    /// missing.
    fn read(batch: &RecordBatch) -> Result<Self> {
        let index_pos = LABEL_COLUMNS
            .iter()
            .position(|(c, _)| *c == "gpu_index")
            .ok_or_else(|| exec("gpu_metrics has no gpu_index column"))?;
        let mut text: Vec<Option<Text>> = Vec::with_capacity(LABEL_COLUMNS.len());
        let mut read: Vec<ArrayRef> = Vec::with_capacity(DCGM_LABEL_COLUMNS.len() + 1);
        let mut index: Option<Int32Array> = None;
        for (c, _) in LABEL_COLUMNS {
            if !DCGM_LABEL_COLUMNS.contains(c) {
                text.push(None);
                continue;
            }
            let a = batch
                .column_by_name(c)
                .ok_or_else(|| exec(format!("gpu_metrics scan lacks {c}")))?;
            read.push(Arc::clone(a));
            if *c == "gpu_index" {
                let i = arrow::compute::cast(a, &DataType::Int32)?;
                index = Some(i.as_primitive::<Int32Type>().clone());
                text.push(None);
            } else {
                text.push(Some(Text::of(a)?));
            }
        }
        let index = index.ok_or_else(|| exec("gpu_metrics scan lacks gpu_index"))?;
        let extra = match batch.column_by_name("series_labels") {
            Some(a) => {
                read.push(Arc::clone(a));
                Some(Text::of(a)?)
            }
            None => None,
        };
        // Rows of one GPU come in runs (files are sorted by host, GPU, time): a run's labels are
        // worked out once.
        let runs = runs(&read, batch.num_rows())?;
        Ok(Self {
            text,
            index,
            index_pos,
            extra,
            runs,
        })
    }

    /// Row `i`'s label cells in `LABEL_COLUMNS` order (`gpu_index` as decimal text in
    /// `idx_text`).
    fn cells<'a>(&'a self, i: usize, idx_text: &'a mut String) -> Vec<Option<&'a str>> {
        idx_text.clear();
        let has_index = !self.index.is_null(i);
        if has_index {
            idx_text.push_str(&self.index.value(i).to_string());
        }
        let idx: &'a str = idx_text;
        self.text
            .iter()
            .enumerate()
            .map(|(c, t)| match c == self.index_pos {
                true => has_index.then_some(idx),
                false => t.as_ref().and_then(|t| t.get(i)),
            })
            .collect()
    }

    /// Row `i`'s labels without the metric name, and the key of the scrape it belongs to.
    fn row(&self, i: usize, idx_text: &mut String) -> Result<(Labels, String)> {
        let cells = self.cells(i, idx_text);
        let extra = match self.extra.as_ref().and_then(|c| c.get(i)) {
            Some(text) => parse_series_labels(text)?,
            None => Vec::new(),
        };
        let base = series_labels(&cells, &extra);
        let key = gpu_target_key(&cells, &base);
        Ok((base, key))
    }
}

/// The runs of consecutive rows of `n` on which every column of `cols` holds the same value
/// (nulls equal), as row ranges.
pub(super) fn runs(cols: &[ArrayRef], n: usize) -> Result<Vec<std::ops::Range<usize>>> {
    let mut change = vec![false; n];
    for c in cols {
        mark_changes(c, &mut change)?;
    }
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..n {
        if change[i] {
            out.push(start..i);
            start = i;
        }
    }
    if n > 0 {
        out.push(start..n);
    }
    Ok(out)
}

/// Sets `change[i]` for each row `i > 0` of `a` that differs from row `i - 1` (nulls equal).
/// Dictionary-encoded text decodes to views that are equal bit for bit, so a string column costs
/// one 16-byte comparison per row; its bytes are compared only where the views differ.
pub(super) fn mark_changes(a: &ArrayRef, change: &mut [bool]) -> Result<()> {
    let n = a.len();
    if n < 2 {
        return Ok(());
    }
    if let Some(v) = a.as_string_view_opt() {
        let views = v.views();
        if v.null_count() == n {
            return Ok(());
        }
        if v.null_count() == 0 {
            for i in 1..n {
                if views[i] != views[i - 1] && !change[i] {
                    change[i] = v.value(i) != v.value(i - 1);
                }
            }
            return Ok(());
        }
        let valid = |i: usize| v.is_valid(i);
        for i in 1..n {
            if change[i] {
                continue;
            }
            let differs = if views[i] == views[i - 1] {
                valid(i) != valid(i - 1)
            } else {
                valid(i) != valid(i - 1) || (valid(i) && v.value(i) != v.value(i - 1))
            };
            change[i] = differs;
        }
        return Ok(());
    }
    let differs = arrow::compute::kernels::cmp::distinct(&a.slice(1, n - 1), &a.slice(0, n - 1))?;
    for (i, d) in differs.values().iter().enumerate() {
        change[i + 1] |= d;
    }
    Ok(())
}

/// Per selected name, its value column of `batch` read as doubles.
pub(super) fn name_values(
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

/// Adds the samples of the rows of `run` (times `t`) to the series in `slots`, one per selected
/// name, and their times to the scrapes of `target`. With steps to read at (an instant selector)
/// and the run in time order, only what a step can read is kept ([`Steps`]); the run's last
/// sample and scrape always are, since the next may come in another run.
fn push_run(
    out: &mut Collector,
    (names, slots, values): (&[GpuName], &[Option<usize>], &[Float64Array]),
    t: &[i64],
    run: std::ops::Range<usize>,
    target: usize,
) {
    let rows = &t[run.clone()];
    let read_at = out.steps.filter(|_| rows.windows(2).all(|w| w[0] < w[1]));
    if !out.labels_only {
        let times = &mut out.target_times[target];
        read(read_at.as_ref(), rows.iter().copied().enumerate(), |i| {
            times.push(rows[i])
        });
    }
    for (j, g) in names.iter().enumerate() {
        let Some(slot) = slots[j] else { continue };
        let (col, s) = (&values[j], &mut out.series[slot]);
        if out.labels_only {
            if let Some(i) = run.clone().find(|&i| !col.is_null(i))
                && s.t.is_empty()
            {
                s.t.push(t[i]);
                s.v.push(unscale(col.value(i), g.scale));
            }
            continue;
        }
        let samples = run.clone().filter(|&i| !col.is_null(i)).map(|i| (i, t[i]));
        read(read_at.as_ref(), samples, |i| {
            s.t.push(t[i]);
            s.v.push(unscale(col.value(i), g.scale));
        });
    }
}

/// Turns one batch of a `gpu_metrics` scan into samples of the series the matchers select,
/// and records the times its targets were scraped.
pub(super) fn gpu_batch(
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
    let mut slots: Vec<Option<usize>> = vec![None; names.len()];
    let mut idx_text = String::new();
    for run in &cols.runs {
        let (base, key) = cols.row(run.start, &mut idx_text)?;
        let target = out.target(&key, Some((base.get("instance"), base.get("job"))));
        for (j, g) in names.iter().enumerate() {
            let labels = base.with(NAME, g.name);
            slots[j] = matches(matchers, &labels).then(|| out.slot(labels, Some(target)));
        }
        push_run(out, (names, &slots, &values), &t, run.clone(), target);
    }
    Ok(())
}

/// The scrape a `gpu_metrics` row belongs to: its GPU (host, UUID, MIG instance) as scraped
/// from one target (`instance`, `job`).
pub(super) fn gpu_target_key(cells: &[Option<&str>], labels: &Labels) -> String {
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
pub(super) fn series_labels(cells: &[Option<&str>], extra: &[(String, String)]) -> Labels {
    let mut pairs: Vec<(String, String)> = dcgm_label_set(cells)
        .into_iter()
        .filter(|(n, _)| !extra.iter().any(|(e, _)| e == n))
        .map(|(n, v)| (n.to_string(), v))
        .collect();
    pairs.extend(extra.iter().cloned());
    Labels::new(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_split_where_any_column_changes() {
        use arrow::array::StringViewArray;
        let long = "GPU-10ab666f-6224-661c-537e-071b4bbcec81";
        let other = "GPU-10ab666f-6224-661c-537e-071b4bbcec82";
        // Equal long strings written separately (views that differ bit for bit), nulls equal.
        let uuid: ArrayRef = Arc::new(StringViewArray::from(vec![
            Some(long),
            Some(long),
            Some(other),
            None,
            None,
            Some("short"),
            Some("short"),
        ]));
        let index: ArrayRef = Arc::new(Int32Array::from(vec![
            Some(0),
            Some(0),
            Some(0),
            Some(0),
            None,
            None,
            Some(1),
        ]));
        let r = runs(&[uuid, index], 7).unwrap();
        assert_eq!(r, vec![0..2, 2..3, 3..4, 4..5, 5..6, 6..7]);
        assert_eq!(runs(&[], 3).unwrap(), vec![0..3]);
        assert!(runs(&[], 0).unwrap().is_empty());
    }

    #[test]
    fn units_come_back_whole() {
        assert_eq!(unscale(0.97, 0.01), 97.0);
        assert_eq!(unscale(0.29, 0.01), 29.0);
        assert_eq!(unscale(49_850.753, 0.001), 49_850_753.0);
        assert_eq!(unscale(2048.0 * 1_048_576.0, 1_048_576.0), 2048.0);
        assert_eq!(unscale(0.5, 1.0), 0.5);
    }
}
