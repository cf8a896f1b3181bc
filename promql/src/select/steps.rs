//! The steps an instant selector is read at, and which samples they can read.
//!
//! At each step an instant selector reads the latest sample at or before it (and the latest scrape
//! of its target, for staleness), so of a run of samples in time order only those followed by a
//! step before the next sample can ever be read: the others are dropped as the rows are read. A
//! 24-hour range at a 60 s step over samples every 10 s keeps one sample in six.

/// The times an instant selector is read at: `first`, `first + step`, … up to `last` (steps less
/// the selector's offset, or its one `@` time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Steps {
    first: i64,
    step: i64,
    last: i64,
}

impl Steps {
    /// Steps from `first` to `last` (inclusive) every `step` ms (at least 1).
    pub fn new(first: i64, step: i64, last: i64) -> Self {
        Self {
            first,
            step: step.max(1),
            last,
        }
    }

    /// Whether a step falls in `[a, b)`.
    pub fn any_in(&self, a: i64, b: i64) -> bool {
        if b <= a || a > self.last || b <= self.first {
            return false;
        }
        let from = a.max(self.first);
        let k = (from - self.first + self.step - 1) / self.step;
        let at = self.first + k * self.step;
        at < b && at <= self.last
    }
}

/// Calls `keep` with the index of each of `rows` (index and time, times strictly increasing)
/// that some of `steps` reads as the latest at or before it: those with a step before the next
/// row's time, and the last (the next may come in another run). Without steps, every row.
pub(super) fn read(
    steps: Option<&Steps>,
    rows: impl IntoIterator<Item = (usize, i64)>,
    mut keep: impl FnMut(usize),
) {
    let mut pending: Option<(usize, i64)> = None;
    for (i, t) in rows {
        if let Some((p, tp)) = pending
            && steps.is_none_or(|s| s.any_in(tp, t))
        {
            keep(p);
        }
        pending = Some((i, t));
    }
    if let Some((p, _)) = pending {
        keep(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_found_in_a_window_only_where_one_falls() {
        let s = Steps::new(100, 60, 400);
        assert!(s.any_in(100, 101));
        assert!(s.any_in(90, 101));
        assert!(!s.any_in(101, 160));
        assert!(s.any_in(101, 161));
        assert!(s.any_in(399, 401));
        assert!(!s.any_in(401, 1000));
        assert!(!s.any_in(0, 100));
        assert!(!s.any_in(150, 150));
        let one = Steps::new(250, 1, 250);
        assert!(one.any_in(250, 251) && !one.any_in(251, 300) && !one.any_in(0, 250));
    }

    #[test]
    fn only_the_samples_a_step_reads_are_kept() {
        // Samples every 10, steps every 60 from 60: 60 reads 60, 120 reads 120, 180 reads 170.
        let s = Steps::new(60, 60, 180);
        let t = [0, 10, 60, 70, 110, 120, 170, 190];
        let mut kept = Vec::new();
        read(Some(&s), t.iter().copied().enumerate(), |i| kept.push(t[i]));
        assert_eq!(kept, vec![60, 120, 170, 190]);
    }
}
