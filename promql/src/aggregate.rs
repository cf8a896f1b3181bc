//! Aggregations (`sum`, `avg`, …, `topk`, `count_values`) and `histogram_quantile`, step by step
//! as Prometheus 2.42 computes them.

use std::collections::HashMap;

use promql_parser::parser::token::{
    T_AVG, T_BOTTOMK, T_COUNT, T_COUNT_VALUES, T_GROUP, T_MAX, T_MIN, T_QUANTILE, T_STDDEV,
    T_STDVAR, T_SUM, T_TOPK,
};
use promql_parser::parser::{AggregateExpr, Expr, LabelModifier};

use crate::error::{Result, bad, exec};
use crate::eval::{Evaluator, Grid, Series, Value, merge_same_labels};
use crate::functions::{scalar_arg, string_arg, vector_arg};
use crate::labels::{Labels, NAME};
use crate::rangefn::quantile;

/// The labels of the group a series falls in.
fn group_labels(l: &Labels, m: &Option<LabelModifier>) -> Labels {
    match m {
        None => Labels::default(),
        Some(LabelModifier::Include(ls)) => l.keep(&ls.labels),
        Some(LabelModifier::Exclude(ls)) => l.drop(&ls.labels).without_name(),
    }
}

/// Evaluates an aggregation at every step of `g`.
pub async fn eval(ev: &Evaluator<'_>, a: &AggregateExpr, g: Grid) -> Result<Value> {
    let op = a.op.id();
    let input = vector_arg(ev, Some(&a.expr), g).await?;
    if op == T_COUNT_VALUES {
        let label = string_arg(a.param.as_deref())?;
        return count_values(input, &label, &a.modifier, g);
    }
    let param = match &a.param {
        Some(p) if op == T_TOPK || op == T_BOTTOMK || op == T_QUANTILE => {
            scalar_arg(ev, Some(p), g).await?
        }
        Some(_) => return Err(bad(format!("{} takes no parameter", a.op))),
        None if op == T_TOPK || op == T_BOTTOMK || op == T_QUANTILE => {
            return Err(bad(format!("{} needs a parameter", a.op)));
        }
        None => Vec::new(),
    };
    // Groups in order of first appearance, and each series' group.
    let mut index: HashMap<Labels, usize> = HashMap::new();
    let mut groups: Vec<Labels> = Vec::new();
    let mut member: Vec<usize> = Vec::with_capacity(input.len());
    for s in &input {
        let gl = group_labels(&s.labels, &a.modifier);
        let next = groups.len();
        let gi = *index.entry(gl.clone()).or_insert_with(|| {
            groups.push(gl);
            next
        });
        member.push(gi);
    }
    if op == T_TOPK || op == T_BOTTOMK {
        return top_k(input, &member, groups.len(), &param, op == T_TOPK, g);
    }
    ev.check_deadline("aggregation")?;
    let mut out: Vec<Series> = groups
        .into_iter()
        .map(|labels| Series {
            labels,
            vals: vec![None; g.len()],
        })
        .collect();
    if op == T_QUANTILE {
        quantiles(&input, &member, &param, &mut out);
    } else {
        // Series by series (each series' values read once, in order); at every step the series
        // are still added in their order, as Prometheus adds them.
        let steps = g.len();
        let mut acc: Vec<Acc> = vec![Acc::default(); out.len() * steps];
        for (s, &gi) in input.iter().zip(&member) {
            let row = &mut acc[gi * steps..(gi + 1) * steps];
            for (a, x) in row.iter_mut().zip(&s.vals) {
                if let Some(x) = x {
                    a.add(op, *x);
                }
            }
        }
        for (gi, o) in out.iter_mut().enumerate() {
            for (v, a) in o.vals.iter_mut().zip(&acc[gi * steps..(gi + 1) * steps]) {
                if a.count > 0 {
                    *v = Some(a.result(op)?);
                }
            }
        }
    }
    out.retain(|s| s.vals.iter().any(Option::is_some));
    Ok(Value::Vector(out))
}

/// `quantile` per group and step, over the group's values at the step.
fn quantiles(input: &[Series], member: &[usize], param: &[f64], out: &mut [Series]) {
    let mut values: Vec<Vec<f64>> = vec![Vec::new(); out.len()];
    for (i, q) in param.iter().enumerate() {
        for v in values.iter_mut() {
            v.clear();
        }
        for (s, &gi) in input.iter().zip(member) {
            if let Some(x) = s.vals.get(i).copied().flatten() {
                values[gi].push(x);
            }
        }
        for (gi, o) in out.iter_mut().enumerate() {
            if !values[gi].is_empty() {
                o.vals[i] = Some(quantile(*q, &values[gi]));
            }
        }
    }
}

/// One group's running aggregate at one step.
#[derive(Debug, Clone, Copy, Default)]
struct Acc {
    count: u64,
    value: f64,
    mean: f64,
}

impl Acc {
    fn add(&mut self, op: u16, x: f64) {
        self.count += 1;
        if self.count == 1 {
            self.value = match op {
                T_STDDEV | T_STDVAR => 0.0,
                T_GROUP => 1.0,
                _ => x,
            };
            self.mean = x;
            return;
        }
        let n = self.count as f64;
        match op {
            T_SUM => self.value += x,
            T_AVG => {
                if self.mean.is_infinite() {
                    if x.is_infinite() && (self.mean > 0.0) == (x > 0.0) {
                        return;
                    }
                    if !x.is_infinite() && !x.is_nan() {
                        return;
                    }
                }
                self.mean += x / n - self.mean / n;
            }
            T_MAX => {
                if self.value < x || self.value.is_nan() {
                    self.value = x;
                }
            }
            T_MIN => {
                if self.value > x || self.value.is_nan() {
                    self.value = x;
                }
            }
            T_STDDEV | T_STDVAR => {
                let delta = x - self.mean;
                self.mean += delta / n;
                self.value += delta * (x - self.mean);
            }
            _ => {}
        }
    }

    fn result(&self, op: u16) -> Result<f64> {
        let n = self.count as f64;
        Ok(match op {
            T_SUM | T_MAX | T_MIN | T_GROUP => self.value,
            T_AVG => self.mean,
            T_COUNT => n,
            T_STDVAR => self.value / n,
            T_STDDEV => (self.value / n).sqrt(),
            other => {
                return Err(bad(format!(
                    "aggregation {} is not supported by gpuwatch",
                    promql_parser::parser::token::TokenType::new(other)
                )));
            }
        })
    }
}

fn top_k(
    input: Vec<Series>,
    member: &[usize],
    groups: usize,
    k: &[f64],
    top: bool,
    g: Grid,
) -> Result<Value> {
    let mut keep: Vec<Vec<Option<f64>>> = vec![vec![None; g.len()]; input.len()];
    let mut per_group: Vec<Vec<(f64, usize)>> = vec![Vec::new(); groups];
    for i in 0..g.len() {
        if k[i] >= 9.223_372_036_854_776e18 || k[i] <= -9.223_372_036_854_776e18 || k[i].is_nan() {
            return Err(exec(format!("scalar value {} overflows int64", k[i])));
        }
        let kk = k[i] as i64;
        if kk < 1 {
            continue;
        }
        for pg in per_group.iter_mut() {
            pg.clear();
        }
        for (n, s) in input.iter().enumerate() {
            if let Some(x) = s.vals[i] {
                per_group[member[n]].push((x, n));
            }
        }
        for pg in per_group.iter_mut() {
            pg.sort_by(|a, b| {
                let o = if top {
                    b.0.partial_cmp(&a.0)
                } else {
                    a.0.partial_cmp(&b.0)
                };
                o.unwrap_or_else(|| a.0.is_nan().cmp(&b.0.is_nan()))
            });
            for &(x, n) in pg.iter().take(kk as usize) {
                keep[n][i] = Some(x);
            }
        }
    }
    let mut out: Vec<Series> = input
        .into_iter()
        .zip(keep)
        .map(|(s, vals)| Series {
            labels: s.labels,
            vals,
        })
        .filter(|s| s.vals.iter().any(Option::is_some))
        .collect();
    if g.len() == 1 {
        out.sort_by(|a, b| {
            let (x, y) = (a.vals[0].unwrap_or(f64::NAN), b.vals[0].unwrap_or(f64::NAN));
            let o = if top {
                y.partial_cmp(&x)
            } else {
                x.partial_cmp(&y)
            };
            o.unwrap_or(std::cmp::Ordering::Equal)
        });
    }
    Ok(Value::Vector(out))
}

/// Go's `strconv.FormatFloat(v, 'f', -1, 64)`.
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

fn count_values(
    input: Vec<Series>,
    label: &str,
    m: &Option<LabelModifier>,
    g: Grid,
) -> Result<Value> {
    let valid = {
        let mut c = label.chars();
        matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
            && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
    };
    if !valid {
        return Err(exec(format!("invalid label name {label:?}")));
    }
    // `by` (or no clause) keeps the value label too; `without` never drops it.
    let modifier = match m {
        Some(LabelModifier::Exclude(ls)) => Some(LabelModifier::Exclude(ls.clone())),
        Some(LabelModifier::Include(ls)) => {
            let mut names = ls.labels.clone();
            names.push(label.to_string());
            Some(LabelModifier::Include(promql_parser::label::Labels {
                labels: names,
            }))
        }
        None => Some(LabelModifier::Include(promql_parser::label::Labels {
            labels: vec![label.to_string()],
        })),
    };
    let mut index: HashMap<Labels, usize> = HashMap::new();
    let mut out: Vec<Series> = Vec::new();
    for i in 0..g.len() {
        for s in &input {
            let Some(x) = s.vals[i] else { continue };
            let l = group_labels(&s.labels.with(label, &format_value(x)), &modifier);
            let next = out.len();
            let gi = *index.entry(l.clone()).or_insert_with(|| {
                out.push(Series {
                    labels: l,
                    vals: vec![None; g.len()],
                });
                next
            });
            let slot = &mut out[gi].vals[i];
            *slot = Some(slot.unwrap_or(0.0) + 1.0);
        }
    }
    Ok(Value::Vector(out))
}

/// `histogram_quantile(φ, buckets)` over classic buckets (series with an `le` label).
pub async fn histogram_quantile(ev: &Evaluator<'_>, args: &[&Expr], g: Grid) -> Result<Value> {
    let q = scalar_arg(ev, args.first().copied(), g).await?;
    let input = vector_arg(ev, args.get(1).copied(), g).await?;
    let mut index: HashMap<Labels, usize> = HashMap::new();
    let mut groups: Vec<(Labels, Vec<(f64, usize)>)> = Vec::new();
    for (n, s) in input.iter().enumerate() {
        let le = s.labels.get("le");
        if le.is_empty() {
            continue;
        }
        let Ok(bound) = parse_le(le) else { continue };
        let gl = s.labels.drop(&["le".to_string()]).without_name();
        let next = groups.len();
        let gi = *index.entry(gl.clone()).or_insert_with(|| {
            groups.push((gl, Vec::new()));
            next
        });
        groups[gi].1.push((bound, n));
    }
    let mut out = Vec::with_capacity(groups.len());
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for (labels, members) in groups {
        let mut vals = vec![None; g.len()];
        for (i, v) in vals.iter_mut().enumerate() {
            buckets.clear();
            for &(b, n) in &members {
                if let Some(c) = input[n].vals[i] {
                    buckets.push((b, c));
                }
            }
            if !buckets.is_empty() {
                *v = Some(bucket_quantile(q[i], &mut buckets));
            }
        }
        out.push(Series { labels, vals });
    }
    out.retain(|s| s.vals.iter().any(Option::is_some));
    Ok(Value::Vector(merge_same_labels(out)?))
}

fn parse_le(s: &str) -> std::result::Result<f64, ()> {
    match s.trim() {
        "+Inf" | "Inf" | "+inf" | "inf" => Ok(f64::INFINITY),
        "-Inf" | "-inf" => Ok(f64::NEG_INFINITY),
        t => t.parse::<f64>().map_err(|_| ()),
    }
}

/// Prometheus's `bucketQuantile`.
fn bucket_quantile(q: f64, b: &mut Vec<(f64, f64)>) -> f64 {
    if q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    b.sort_by(|x, y| x.0.partial_cmp(&y.0).unwrap_or(std::cmp::Ordering::Equal));
    if b.last().is_none_or(|l| l.0 != f64::INFINITY) {
        return f64::NAN;
    }
    // Buckets with the same bound are added together.
    let mut merged: Vec<(f64, f64)> = Vec::with_capacity(b.len());
    for &(ub, c) in b.iter() {
        match merged.last_mut() {
            Some(last) if last.0 == ub => last.1 += c,
            _ => merged.push((ub, c)),
        }
    }
    // Counts made monotonic.
    let mut max = f64::NEG_INFINITY;
    for m in merged.iter_mut() {
        if m.1 > max {
            max = m.1;
        } else if m.1 < max {
            m.1 = max;
        }
    }
    if merged.len() < 2 {
        return f64::NAN;
    }
    let observations = merged[merged.len() - 1].1;
    if observations == 0.0 {
        return f64::NAN;
    }
    let mut rank = q * observations;
    let last = merged.len() - 1;
    let i = merged[..last].partition_point(|m| m.1 < rank);
    if i == last {
        return merged[last - 1].0;
    }
    if i == 0 && merged[0].0 <= 0.0 {
        return merged[0].0;
    }
    let (mut start, end, mut count) = (0.0, merged[i].0, merged[i].1);
    if i > 0 {
        start = merged[i - 1].0;
        count -= merged[i - 1].1;
        rank -= merged[i - 1].1;
    }
    start + (end - start) * (rank / count)
}

/// `NAME` is used by the binary operators too.
pub const METRIC_NAME: &str = NAME;
