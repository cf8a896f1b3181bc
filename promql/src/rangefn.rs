//! The functions over a range of samples (`rate`, `*_over_time`, …), computed as Prometheus 2.42
//! computes them: the window of a step is `[t - range, t]`, both ends included.

use crate::error::Result;
use crate::eval::{Evaluator, Grid, Series, Windowed, bounds};

/// A function of one window: times (ms), values, the window's bounds, and its scalar
/// parameters at the step.
pub type RangeFn = fn(&[i64], &[f64], (i64, i64), &[f64]) -> Option<f64>;

/// The range function called `name`.
pub fn lookup(name: &str) -> Option<RangeFn> {
    Some(match name {
        "rate" => |t, v, w, _| extrapolated(t, v, w, true, true),
        "increase" => |t, v, w, _| extrapolated(t, v, w, true, false),
        "delta" => |t, v, w, _| extrapolated(t, v, w, false, false),
        "irate" => |t, v, _, _| instant(t, v, true),
        "idelta" => |t, v, _, _| instant(t, v, false),
        "deriv" => |t, v, _, _| (t.len() >= 2).then(|| regression(t, v, t[0]).0),
        "predict_linear" => |t, v, w, p| {
            if t.len() < 2 {
                return None;
            }
            let (slope, intercept) = regression(t, v, w.1);
            Some(slope * p[0] + intercept)
        },
        "resets" => |_, v, _, _| {
            (!v.is_empty()).then(|| v.windows(2).filter(|p| p[1] < p[0]).count() as f64)
        },
        "changes" => |_, v, _, _| {
            (!v.is_empty()).then(|| {
                v.windows(2)
                    .filter(|p| !(p[1] == p[0] || (p[1].is_nan() && p[0].is_nan())))
                    .count() as f64
            })
        },
        "avg_over_time" => |_, v, _, _| (!v.is_empty()).then(|| avg(v)),
        "sum_over_time" => |_, v, _, _| (!v.is_empty()).then(|| v.iter().sum()),
        "count_over_time" => |_, v, _, _| (!v.is_empty()).then_some(v.len() as f64),
        "min_over_time" => |_, v, _, _| {
            (!v.is_empty()).then(|| {
                v.iter()
                    .copied()
                    .fold(v[0], |m, x| if x < m || m.is_nan() { x } else { m })
            })
        },
        "max_over_time" => |_, v, _, _| {
            (!v.is_empty()).then(|| {
                v.iter()
                    .copied()
                    .fold(v[0], |m, x| if x > m || m.is_nan() { x } else { m })
            })
        },
        "last_over_time" => |_, v, _, _| v.last().copied(),
        "present_over_time" => |_, v, _, _| (!v.is_empty()).then_some(1.0),
        "stddev_over_time" => |_, v, _, _| (!v.is_empty()).then(|| variance(v).sqrt()),
        "stdvar_over_time" => |_, v, _, _| (!v.is_empty()).then(|| variance(v)),
        "quantile_over_time" => |_, v, _, p| (!v.is_empty()).then(|| quantile(p[0], v)),
        "holt_winters" => |_, v, _, p| holt_winters(v, p[0], p[1]),
        "absent_over_time" => |_, _, _, _| None,
        _ => return None,
    })
}

/// Applies `f` to the window of every step of every series; the metric name is dropped, but
/// for `last_over_time` (`keep_name`), as Prometheus 2.42 does.
pub fn apply(
    ev: &Evaluator<'_>,
    w: &Windowed,
    g: Grid,
    f: RangeFn,
    scalars: &[Vec<f64>],
    keep_name: bool,
) -> Result<Vec<Series>> {
    let mut out = Vec::with_capacity(w.series.len());
    let mut params = vec![0.0; scalars.len()];
    for (n, s) in w.series.iter().enumerate() {
        if n % 256 == 0 {
            ev.check_deadline("range functions")?;
        }
        let mut vals = vec![None; g.len()];
        let (mut a, mut b) = (0usize, 0usize);
        for (i, slot) in vals.iter_mut().enumerate() {
            let (lo, hi) = w.window(g.at(i));
            if w.at.is_some() || i == 0 {
                (a, b) = bounds(&s.t, lo, hi);
            } else {
                while a < s.t.len() && s.t[a] < lo {
                    a += 1;
                }
                b = b.max(a);
                while b < s.t.len() && s.t[b] <= hi {
                    b += 1;
                }
            }
            if a >= b {
                continue;
            }
            for (p, sc) in params.iter_mut().zip(scalars) {
                *p = sc[i];
            }
            *slot = f(&s.t[a..b], &s.v[a..b], (lo, hi), &params);
        }
        if vals.iter().any(Option::is_some) {
            out.push(Series {
                labels: if keep_name {
                    s.labels.clone()
                } else {
                    s.labels.without_name()
                },
                vals,
            });
        }
    }
    Ok(out)
}

/// `rate`, `increase` and `delta` with Prometheus's extrapolation to the window's edges.
fn extrapolated(
    t: &[i64],
    v: &[f64],
    (start, end): (i64, i64),
    counter: bool,
    rate: bool,
) -> Option<f64> {
    if t.len() < 2 {
        return None;
    }
    let n = t.len();
    let mut result = v[n - 1] - v[0];
    if counter {
        let mut last = 0.0;
        for &x in v {
            if x < last {
                result += last;
            }
            last = x;
        }
    }
    let mut to_start = (t[0] - start) as f64 / 1000.0;
    let to_end = (end - t[n - 1]) as f64 / 1000.0;
    let sampled = (t[n - 1] - t[0]) as f64 / 1000.0;
    let avg_step = sampled / (n - 1) as f64;
    if counter && result > 0.0 && v[0] >= 0.0 {
        let to_zero = sampled * (v[0] / result);
        if to_zero < to_start {
            to_start = to_zero;
        }
    }
    let threshold = avg_step * 1.1;
    let mut interval = sampled;
    interval += if to_start < threshold {
        to_start
    } else {
        avg_step / 2.0
    };
    interval += if to_end < threshold {
        to_end
    } else {
        avg_step / 2.0
    };
    let mut out = result * (interval / sampled);
    if rate {
        out /= (end - start) as f64 / 1000.0;
    }
    Some(out)
}

/// `irate` and `idelta`: the last two samples.
fn instant(t: &[i64], v: &[f64], rate: bool) -> Option<f64> {
    let n = t.len();
    if n < 2 {
        return None;
    }
    let (lt, lv, pt, pv) = (t[n - 1], v[n - 1], t[n - 2], v[n - 2]);
    let mut out = if rate && lv < pv { lv } else { lv - pv };
    let dt = lt - pt;
    if dt == 0 {
        return None;
    }
    if rate {
        out /= dt as f64 / 1000.0;
    }
    Some(out)
}

/// Least-squares slope and intercept (at `intercept_time`) of the samples, x in seconds.
fn regression(t: &[i64], v: &[f64], intercept_time: i64) -> (f64, f64) {
    let (mut n, mut sx, mut sy, mut sxy, mut sx2) = (0.0, 0.0, 0.0, 0.0, 0.0);
    let init = v[0];
    let mut constant = true;
    for (i, (&ti, &vi)) in t.iter().zip(v).enumerate() {
        if constant && i > 0 && vi != init {
            constant = false;
        }
        n += 1.0;
        let x = (ti - intercept_time) as f64 / 1e3;
        sx += x;
        sy += vi;
        sxy += x * vi;
        sx2 += x * x;
    }
    if constant {
        if init.is_infinite() {
            return (f64::NAN, f64::NAN);
        }
        return (0.0, init);
    }
    let cov = sxy - sx * sy / n;
    let var = sx2 - sx * sx / n;
    let slope = cov / var;
    (slope, sy / n - slope * sx / n)
}

/// The mean, computed incrementally as Prometheus does (no overflow for large values).
fn avg(v: &[f64]) -> f64 {
    let mut mean: f64 = 0.0;
    let mut count: f64 = 0.0;
    for &x in v {
        count += 1.0;
        if mean.is_infinite() {
            if x.is_infinite() && (mean > 0.0) == (x > 0.0) {
                continue;
            }
            if !x.is_infinite() && !x.is_nan() {
                continue;
            }
        }
        mean += x / count - mean / count;
    }
    mean
}

/// The population variance (Welford).
pub(crate) fn variance(v: &[f64]) -> f64 {
    let (mut count, mut mean, mut m2) = (0.0, 0.0, 0.0);
    for &x in v {
        count += 1.0;
        let delta = x - mean;
        mean += delta / count;
        m2 += delta * (x - mean);
    }
    m2 / count
}

/// Prometheus's quantile: linear interpolation between the closest ranks.
pub(crate) fn quantile(q: f64, v: &[f64]) -> f64 {
    if v.is_empty() || q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    let mut sorted = v.to_vec();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let n = sorted.len() as f64;
    let rank = q * (n - 1.0);
    let lower = rank.floor().max(0.0);
    let upper = (lower + 1.0).min(n - 1.0);
    let weight = rank - rank.floor();
    sorted[lower as usize] * (1.0 - weight) + sorted[upper as usize] * weight
}

fn holt_winters(v: &[f64], sf: f64, tf: f64) -> Option<f64> {
    if !(sf > 0.0 && sf < 1.0) || !(tf > 0.0 && tf < 1.0) || v.len() < 2 {
        return None;
    }
    let (mut s0, mut s1, mut b) = (0.0, v[0], v[1] - v[0]);
    for (i, &x) in v.iter().enumerate().skip(1) {
        if i > 1 {
            b = tf * (s1 - s0) + (1.0 - tf) * b;
        }
        let next = sf * x + (1.0 - sf) * (s1 + b);
        s0 = s1;
        s1 = next;
    }
    Some(s1)
}
