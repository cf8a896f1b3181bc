//! Series built from the scans' rows: samples per label set, the scrapes of each target, and
//! the stale markers Prometheus would have written.

use super::*;

/// Series being built, keyed by label set, with the scrapes ("targets") they came from.
#[derive(Default)]
pub(super) struct Collector {
    pub(super) index: HashMap<Labels, usize>,
    pub(super) series: Vec<RawSeries>,
    /// Per series, its target (an index into `target_times`), if it has one.
    pub(super) target_of: Vec<Option<usize>>,
    pub(super) targets: HashMap<String, usize>,
    /// Per target, the times at which it was scraped.
    pub(super) target_times: Vec<Vec<i64>>,
    /// Per target, the scrape job it belongs to (`instance`, `job`), when known.
    pub(super) target_job: Vec<Option<(String, String)>>,
    /// Only which series exist is wanted: one sample each is kept, none counted.
    pub(super) labels_only: bool,
    /// The steps an instant selector reads at: samples and scrapes no step reads are dropped.
    pub(super) steps: Option<Steps>,
}

impl Collector {
    pub(super) fn target(&mut self, key: &str, job: Option<(&str, &str)>) -> usize {
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
    pub(super) async fn add_failed_scrapes(
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

    pub(super) fn slot(&mut self, labels: Labels, target: Option<usize>) -> usize {
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

    /// Adds what another collector of the same scan read (another share of its files).
    pub(super) fn absorb(&mut self, other: Collector) {
        let mut keys = vec![String::new(); other.target_times.len()];
        for (k, i) in other.targets {
            keys[i] = k;
        }
        let mut target_map = Vec::with_capacity(keys.len());
        for ((key, times), job) in keys.iter().zip(other.target_times).zip(&other.target_job) {
            let job = job.as_ref().map(|(i, j)| (i.as_str(), j.as_str()));
            let t = self.target(key, job);
            self.target_times[t].extend(times);
            target_map.push(t);
        }
        for (s, target) in other.series.into_iter().zip(other.target_of) {
            let slot = self.slot(s.labels, target.map(|t| target_map[t]));
            let dst = &mut self.series[slot];
            if self.labels_only && !dst.t.is_empty() {
                continue;
            }
            dst.t.extend(s.t);
            dst.v.extend(s.v);
        }
    }

    /// Sorted samples per series (of two samples at one time the later written wins), and the
    /// stale markers Prometheus would have written: a series goes stale at the first later
    /// scrape of its target in which it has no sample.
    pub(super) fn finish(mut self) -> Vec<RawSeries> {
        for times in &mut self.target_times {
            match piece_order(times) {
                Some(p) if p.len() > 1 => *times = gather(times, &p),
                Some(_) => {}
                None => {
                    times.sort();
                    times.dedup();
                }
            }
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

/// The ranges of `t`'s strictly increasing pieces (one per file or batch read) in time order,
/// when no two overlap; `None` when some do (a sample written twice, two scrapes of one target
/// at once).
pub(super) fn piece_order(t: &[i64]) -> Option<Vec<std::ops::Range<usize>>> {
    let mut pieces = Vec::new();
    let mut start = 0;
    for i in 1..t.len() {
        if t[i] <= t[i - 1] {
            pieces.push(start..i);
            start = i;
        }
    }
    if !t.is_empty() {
        pieces.push(start..t.len());
    }
    pieces.sort_by_key(|r| t[r.start]);
    pieces
        .windows(2)
        .all(|w| t[w[0].end - 1] < t[w[1].start])
        .then_some(pieces)
}

/// `x`'s pieces, in the order given.
pub(super) fn gather<T: Copy>(x: &[T], pieces: &[std::ops::Range<usize>]) -> Vec<T> {
    let mut out = Vec::with_capacity(x.len());
    for r in pieces {
        out.extend_from_slice(&x[r.clone()]);
    }
    out
}

/// Sorts a series' samples by time (of two at one time, the later read wins).
pub(super) fn sort_samples(s: &mut RawSeries) {
    match piece_order(&s.t) {
        Some(p) if p.len() == 1 => return,
        Some(p) => {
            s.t = gather(&s.t, &p);
            s.v = gather(&s.v, &p);
            return;
        }
        None if s.t.is_empty() => return,
        None => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn a_series_goes_stale_at_the_first_scrape_without_it() {
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
    pub(super) fn pieces_read_out_of_order_are_put_back_in_order() {
        let mut s = RawSeries {
            t: vec![50, 60, 70, 10, 20, 30, 40],
            v: vec![5.0, 6.0, 7.0, 1.0, 2.0, 3.0, 4.0],
            ..RawSeries::default()
        };
        sort_samples(&mut s);
        assert_eq!(s.t, vec![10, 20, 30, 40, 50, 60, 70]);
        assert_eq!(s.v, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        // Overlapping pieces (a time written twice): sorted, the later read wins.
        let mut s = RawSeries {
            t: vec![20, 30, 10, 20],
            v: vec![2.0, 3.0, 1.0, 9.0],
            ..RawSeries::default()
        };
        sort_samples(&mut s);
        assert_eq!(s.t, vec![10, 20, 30]);
        assert_eq!(s.v, vec![1.0, 9.0, 3.0]);
        assert!(piece_order(&[]).is_some_and(|p| p.is_empty()));
    }
}
