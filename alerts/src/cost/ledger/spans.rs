//! Each job's span in the ledger: its first and last folded hour. A question about some jobs
//! (`jobs WHERE last_seen >= X`, `job_hours WHERE hour` in a month, one job's report) reads
//! the ledger's hours from the first hour of the jobs it can be about to the last, not the
//! whole table: every job it may return is then read whole (the `jobs` sums and the work split
//! need all of a job's hours), and the other jobs read in part are the ones its filter drops.
//!
//! The index is read from the table once, after the ledger first loads (until then the views
//! read the whole table), then kept current: each folded hour adds its jobs before the
//! snapshot that covers it is published, and files the index has not seen (another server's
//! folds, merged days) are read from their first hour on. A span only grows, so a job refolded
//! out of an hour keeps a span that still covers its rows.

use std::collections::{BTreeMap, HashMap, HashSet};

use arrow::array::Array;

use datafusion::prelude::SessionContext;

use super::super::shares::shares_of;
use super::{DfResult, HOUR, floor_hour, table};
use crate::cost::ledger::bounds::Ask;
use gpuwatch_store::persist::FileMeta;

/// The spans, and the files they were read from.
#[derive(Debug, Default)]
pub(super) struct Spans {
    /// Whether the whole table was read (before, no question is bounded).
    ready: bool,
    /// Job id → (first hour, last hour), nanoseconds.
    jobs: HashMap<String, (i64, i64)>,
    /// How many jobs have each (last hour, first hour): a question bounded in time looks at
    /// the spans that can meet its bounds, not at every job (millions over a year).
    by_last: BTreeMap<(i64, i64), u32>,
    /// The table's files already read.
    files: HashSet<String>,
}

/// The hours `[from, to)` of the ledger a question reads.
pub(super) type Range = (i64, i64);

impl Spans {
    /// Jobs indexed.
    pub(super) fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether the whole table was read.
    pub(super) fn ready(&self) -> bool {
        self.ready
    }

    /// Extends `job`'s span to cover `hour`.
    pub(super) fn add(&mut self, job: &str, hour: i64) {
        self.cover(job, (hour, hour));
    }

    /// Extends `job`'s span to cover the hours `first..=last`.
    fn cover(&mut self, job: &str, (first, last): (i64, i64)) {
        let span = match self.jobs.get(job) {
            Some(&(f, l)) if f <= first && last <= l => return,
            Some(&(f, l)) => (f.min(first), l.max(last)),
            None => (first, last),
        };
        self.put(job, span);
    }

    /// Sets `job`'s span.
    fn put(&mut self, job: &str, (first, last): (i64, i64)) {
        let old = match self.jobs.get_mut(job) {
            Some(s) => Some(std::mem::replace(s, (first, last))),
            None => {
                self.jobs.insert(job.to_string(), (first, last));
                None
            }
        };
        if let Some((f, l)) = old
            && let Some(n) = self.by_last.get_mut(&(l, f))
        {
            *n -= 1;
            if *n == 0 {
                self.by_last.remove(&(l, f));
            }
        }
        *self.by_last.entry((last, first)).or_default() += 1;
    }

    /// The files of `files` not read yet, and the first hour of the earliest (`None` when
    /// every file was read).
    pub(super) fn unread(&self, files: &[FileMeta]) -> Option<(i64, Vec<String>)> {
        let new: Vec<&FileMeta> = files
            .iter()
            .filter(|f| !self.files.contains(&f.path))
            .collect();
        if new.is_empty() {
            return None;
        }
        let from = new
            .iter()
            .filter(|f| f.has_time_range())
            .map(|f| floor_hour(f.min_time))
            .min()
            .unwrap_or(i64::MIN);
        Some((from, new.iter().map(|f| f.path.clone()).collect()))
    }

    /// Adds what `rows` (job, first hour, last hour) say and marks `files` read.
    pub(super) fn merge(&mut self, rows: Vec<(String, i64, i64)>, files: Vec<String>) {
        for (job, first, last) in rows {
            self.cover(&job, (first, last));
        }
        self.files.extend(files);
    }

    /// Marks the index whole: every file of the table was read.
    /// The jobs whose last hour is in `[from, to)`, and the first hour of the earliest of them.
    pub(super) fn ending_in(&self, from: i64, to: i64) -> (Vec<String>, Option<i64>) {
        self.jobs_where(|_, last| last >= from && last < to)
    }

    /// The jobs with an hour at or after `t` and one before it, and the first hour of the
    /// earliest.
    pub(super) fn started_before(&self, t: i64) -> (Vec<String>, Option<i64>) {
        self.jobs_where(|first, last| last >= t && first < t)
    }

    /// The jobs whose first and last hours pass `keep`, sorted, and the earliest first hour.
    fn jobs_where(&self, keep: impl Fn(i64, i64) -> bool) -> (Vec<String>, Option<i64>) {
        let mut first: Option<i64> = None;
        let mut jobs: Vec<String> = Vec::new();
        for (job, &(f, last)) in &self.jobs {
            if keep(f, last) {
                jobs.push(job.clone());
                first = Some(first.map_or(f, |x| x.min(f)));
            }
        }
        jobs.sort_unstable();
        (jobs, first)
    }

    /// The last hour of `job`, when it has one.
    pub(super) fn last_hour(&self, job: &str) -> Option<i64> {
        self.jobs.get(job).map(|&(_, last)| last)
    }

    /// The first and last hour of `job`, when it has one.
    pub(super) fn span(&self, job: &str) -> Option<(i64, i64)> {
        self.jobs.get(job).copied()
    }

    /// The jobs with an hour at or after `t`.
    pub(super) fn since(&self, t: i64) -> Vec<&str> {
        let mut jobs: Vec<&str> = self
            .jobs
            .iter()
            .filter(|(_, (_, last))| *last >= t)
            .map(|(j, _)| j.as_str())
            .collect();
        jobs.sort_unstable();
        jobs
    }

    pub(super) fn set_ready(&mut self) {
        self.ready = true;
    }

    /// The hours a question `ask` reads, below the watermark `w`: from the first hour of every
    /// job it may return to the last. `live` are the jobs with raw samples at or after `w`
    /// (their rows pass a time filter whatever their ledger hours). `None`: read every hour
    /// (the index is not read yet, or the question names no bound).
    pub(super) fn range(&self, ask: &Ask, live: &HashSet<String>, w: i64) -> Option<Range> {
        if !self.ready || !ask.bounded() {
            return None;
        }
        let mut range: Option<Range> = None;
        let mut take = |(first, last): (i64, i64)| {
            let (f, t) = range.unwrap_or((first, last + HOUR));
            range = Some((f.min(first), t.max(last + HOUR)));
        };
        match &ask.jobs {
            Some(ids) => ids
                .iter()
                .filter_map(|j| self.jobs.get(j).map(|s| (j, *s)))
                .filter(|(j, s)| ask.may_return(*s, live.contains(j.as_str())))
                .for_each(|(_, s)| take(s)),
            None => {
                // The spans that can reach the lower bound, then the live jobs (which reach
                // the present whatever their hours: `may_return` is wider for them).
                let from = ask.low.map_or(i64::MIN, |l| l.saturating_sub(HOUR - 1));
                self.by_last
                    .range((from, i64::MIN)..)
                    .map(|(&(last, first), _)| (first, last))
                    .filter(|&s| ask.may_return(s, false))
                    .for_each(&mut take);
                live.iter()
                    .filter_map(|j| self.jobs.get(j))
                    .filter(|&&s| ask.may_return(s, true))
                    .for_each(|&s| take(s));
            }
        }
        Some(match range {
            Some((from, to)) => (from, to.min(w)),
            None => (w, w),
        })
    }
}

/// Each job's first and last hour in the table from hour `from` on.
pub(super) async fn read(ctx: &SessionContext, from: i64) -> DfResult<Vec<(String, i64, i64)>> {
    let from = if from == i64::MIN {
        String::new()
    } else {
        format!(" AND time >= to_timestamp_nanos({from})")
    };
    let sql = format!(
        "SELECT job_id, CAST(min(time) AS BIGINT) AS first, CAST(max(time) AS BIGINT) AS last \
         FROM {name} WHERE job_id IS NOT NULL{from} GROUP BY job_id",
        name = table::NAME,
    );
    let mut out = Vec::new();
    for b in ctx.sql(&sql).await?.collect().await? {
        let (ids, first, last) = (
            super::strings(&b, 0)?,
            super::ints(&b, 1)?,
            super::ints(&b, 2)?,
        );
        for i in 0..b.num_rows() {
            if ids.is_null(i) || first.is_null(i) || last.is_null(i) {
                continue;
            }
            out.push((ids.value(i).to_string(), first.value(i), last.value(i)));
        }
    }
    Ok(out)
}

/// The jobs of the raw samples at or after `w` (a shared GPU's too).
pub(super) async fn live(ctx: &SessionContext, w: i64) -> DfResult<HashSet<String>> {
    let sql = format!(
        "SELECT DISTINCT job_id, job_shares FROM gpu_metrics \
         WHERE time >= to_timestamp_nanos({w}) AND job_id IS NOT NULL"
    );
    let mut out = HashSet::new();
    for b in ctx.sql(&sql).await?.collect().await? {
        let (ids, shares) = (super::strings(&b, 0)?, super::strings(&b, 1)?);
        for i in 0..b.num_rows() {
            for (job, _) in shares_of(super::opt(&ids, i), super::opt(&shares, i)) {
                out.insert(job.to_string());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: i64 = HOUR;

    fn spans() -> Spans {
        let mut s = Spans::default();
        // a: hours 0..2, b: hours 5..9, c: hour 20, d: hours 1..30 (still running).
        s.merge(
            vec![
                ("a".into(), 0, 2 * H),
                ("b".into(), 5 * H, 9 * H),
                ("c".into(), 20 * H, 20 * H),
                ("d".into(), H, 30 * H),
            ],
            vec![],
        );
        s
    }

    #[test]
    fn a_question_reads_the_whole_life_of_every_job_it_may_return_and_no_more() {
        let mut s = spans();
        let w = 31 * H;
        let none = HashSet::new();
        let since = |t: i64| Ask {
            low: Some(t),
            ..Ask::default()
        };
        assert_eq!(s.range(&since(19 * H), &none, w), None, "not ready");
        s.set_ready();
        // Jobs seen from hour 19 on: c and d; d started at hour 1.
        assert_eq!(s.range(&since(19 * H + 30), &none, w), Some((H, 31 * H)));
        // Without d running that long, only c's hour.
        s.put("d", (H, 3 * H));
        assert_eq!(s.range(&since(19 * H), &none, w), Some((20 * H, 21 * H)));
        // A job with raw samples after the watermark is read whole whatever its hours.
        let live: HashSet<String> = ["b".to_string()].into();
        assert_eq!(s.range(&since(19 * H), &live, w), Some((5 * H, 21 * H)));
        // Nothing can match: nothing is read.
        assert_eq!(s.range(&since(40 * H), &none, w), Some((w, w)));
        // One job: its span; an unknown job: nothing.
        let one = |j: &str| Ask {
            jobs: Some(vec![j.to_string()]),
            ..Ask::default()
        };
        assert_eq!(s.range(&one("b"), &none, w), Some((5 * H, 10 * H)));
        assert_eq!(s.range(&one("zz"), &none, w), Some((w, w)));
        // A month: jobs seen in hours 4..=9 (first seen by 9, last seen from 4).
        let month = Ask {
            low: Some(4 * H),
            high: Some(9 * H),
            ..Ask::default()
        };
        assert_eq!(s.range(&month, &none, w), Some((5 * H, 10 * H)));
        // No bound at all: everything.
        assert_eq!(s.range(&Ask::default(), &none, w), None);
        // The end stops at the watermark.
        s.add("c", 40 * H);
        assert_eq!(s.range(&one("c"), &none, w), Some((20 * H, w)));
    }

    /// The range of every job that may be returned, looking at each job.
    fn every_job(s: &Spans, ask: &Ask, live: &HashSet<String>, w: i64) -> Option<Range> {
        let spans: Vec<(i64, i64)> = s
            .jobs
            .iter()
            .filter(|(j, sp)| ask.may_return(**sp, live.contains(j.as_str())))
            .map(|(_, sp)| *sp)
            .collect();
        let from = spans.iter().map(|s| s.0).min();
        let to = spans.iter().map(|s| s.1 + H).max();
        Some(from.zip(to).map_or((w, w), |(f, t)| (f, t.min(w))))
    }

    #[test]
    fn the_spans_by_last_hour_give_the_range_that_looking_at_every_job_gives() {
        let mut s = Spans::default();
        s.set_ready();
        // 200 jobs whose spans grow as hours are added out of order.
        for i in 0..200i64 {
            let job = format!("j{i}");
            for k in [i % 37, (i * 7) % 53, i % 11 + 5] {
                s.add(&job, k * H);
            }
        }
        let count: u32 = s.by_last.values().sum();
        assert_eq!(count as usize, s.len(), "one count per job");
        let w = 60 * H;
        let live: HashSet<String> = ["j3".to_string(), "j150".to_string()].into();
        for low in [None, Some(0), Some(10 * H + 5), Some(40 * H), Some(70 * H)] {
            for high in [None, Some(3 * H), Some(20 * H)] {
                for last_high in [None, Some(12 * H), Some(50 * H)] {
                    let ask = Ask {
                        low,
                        high,
                        last_high,
                        ..Ask::default()
                    };
                    for l in [&HashSet::new(), &live] {
                        let want = if ask.bounded() {
                            every_job(&s, &ask, l, w)
                        } else {
                            None
                        };
                        assert_eq!(s.range(&ask, l, w), want, "{ask:?} live {l:?}");
                    }
                }
            }
        }
    }
}
