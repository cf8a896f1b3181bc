//! `metrics` rows as series: their name and `labels` map.

use super::*;

/// The (name, value) pairs of row `i` of a map column.
pub(super) fn map_pairs(map: &MapArray, i: usize) -> Result<Vec<(String, String)>> {
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

pub(super) async fn metric_names(
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

pub(super) async fn scan_metrics(
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
    let matchers = matchers.to_vec();
    let b = budget.clone();
    scan_parts(engine, &sql, budget, out, move |batch, part| {
        metrics_batch(batch, &matchers, &b, part)
    })
    .await
}

/// The (name, value) entries of each row of a `labels` map column.
pub(super) struct MapRows {
    offsets: Vec<usize>,
    keys: Text,
    values: Text,
}

impl MapRows {
    fn of(map: &MapArray) -> Result<Self> {
        let entries = map.entries();
        Ok(Self {
            offsets: map.value_offsets().iter().map(|&o| o as usize).collect(),
            keys: Text::of(entries.column(0))?,
            values: Text::of(entries.column(1))?,
        })
    }

    /// Whether rows `i` and `j` hold the same entries (in the same order).
    fn same(&self, map: &MapArray, i: usize, j: usize) -> bool {
        let (a, b) = (
            self.offsets[i]..self.offsets[i + 1],
            self.offsets[j]..self.offsets[j + 1],
        );
        if map.is_null(i) != map.is_null(j) || a.len() != b.len() {
            return false;
        }
        a.zip(b)
            .all(|(x, y)| self.keys.same(x, y) && self.values.same(x, y))
    }
}

/// Turns one batch of a `metrics` scan into samples of the series the matchers select, and
/// records the times its targets were scraped.
pub(super) fn metrics_batch(
    batch: &RecordBatch,
    matchers: &[Matcher],
    budget: &Budget,
    out: &mut Collector,
) -> Result<()> {
    let n = batch.num_rows();
    if !out.labels_only {
        budget.take(n)?;
    }
    let t = times_ms(batch)?;
    let metric = Text::of(batch.column(1))?;
    let value = values_f64(batch.column(2))?;
    let map = batch.column(3).as_map_opt().cloned();
    let rows = map.as_ref().map(MapRows::of).transpose()?;
    let (mut slot, mut target) = (None, None);
    for i in 0..n {
        let same = i > 0
            && metric.same(i, i - 1)
            && match (&map, &rows) {
                (Some(m), Some(r)) => r.same(m, i, i - 1),
                _ => true,
            };
        if !same {
            let name = metric.get(i).unwrap_or_default();
            let mut all = match &map {
                Some(m) => map_pairs(m, i)?,
                None => Vec::new(),
            };
            all.push((NAME.to_string(), name.to_string()));
            let labels = Labels::new(all);
            // A scraped series (with `instance` and `job`) is one of its metric's on that
            // target; others have no target and go stale by lookback only.
            let (inst, job) = (labels.get("instance"), labels.get("job"));
            target = (!inst.is_empty() && !job.is_empty())
                .then(|| out.target(&format!("{name}\u{1}{inst}\u{1}{job}"), Some((inst, job))));
            slot = matches(matchers, &labels).then(|| out.slot(labels, target));
        }
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
    Ok(())
}
