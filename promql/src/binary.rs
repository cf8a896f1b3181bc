//! Binary operators: arithmetic, comparison (with `bool`), `atan2`, and the set operators, with
//! vector matching (`on`, `ignoring`, `group_left`, `group_right`) as Prometheus 2.42 does it.

use std::collections::HashMap;

use promql_parser::parser::token::{
    T_ADD, T_ATAN2, T_DIV, T_EQLC, T_GTE, T_GTR, T_LAND, T_LOR, T_LSS, T_LTE, T_LUNLESS, T_MOD,
    T_MUL, T_NEQ, T_POW, T_SUB,
};
use promql_parser::parser::{BinModifier, BinaryExpr, LabelModifier, VectorMatchCardinality};

use crate::error::{Result, bad, exec};
use crate::eval::{Evaluator, Grid, Series, Value, merge_same_labels};
use crate::labels::Labels;

fn is_comparison(op: u16) -> bool {
    matches!(op, T_EQLC | T_NEQ | T_GTR | T_LSS | T_GTE | T_LTE)
}

fn drops_name(op: u16) -> bool {
    matches!(op, T_ADD | T_SUB | T_MUL | T_DIV | T_POW | T_MOD)
}

/// Prometheus's `vectorElemBinop`: the value and whether a comparison keeps it.
fn apply(op: u16, l: f64, r: f64) -> (f64, bool) {
    match op {
        T_ADD => (l + r, true),
        T_SUB => (l - r, true),
        T_MUL => (l * r, true),
        T_DIV => (l / r, true),
        T_POW => (l.powf(r), true),
        T_MOD => (l % r, true),
        T_ATAN2 => (l.atan2(r), true),
        T_EQLC => (l, l == r),
        T_NEQ => (l, l != r),
        T_GTR => (l, l > r),
        T_LSS => (l, l < r),
        T_GTE => (l, l >= r),
        T_LTE => (l, l <= r),
        _ => (f64::NAN, false),
    }
}

/// Evaluates `b` at every step of `g`.
pub async fn eval(ev: &Evaluator<'_>, b: &BinaryExpr, g: Grid) -> Result<Value> {
    let op = b.op.id();
    let modifier = b.modifier.clone().unwrap_or_default();
    if modifier.fill_values.lhs.is_some() || modifier.fill_values.rhs.is_some() {
        return Err(bad(
            "fill modifiers are not supported (Prometheus 2.42 has none)",
        ));
    }
    let lhs = ev.eval(&b.lhs, g).await?;
    let rhs = ev.eval(&b.rhs, g).await?;
    let ret_bool = modifier.return_bool;
    match (lhs, rhs) {
        (Value::Scalar(l), Value::Scalar(r)) => Ok(Value::Scalar(
            l.iter()
                .zip(&r)
                .map(|(&x, &y)| {
                    let (v, keep) = apply(op, x, y);
                    if is_comparison(op) {
                        if keep { 1.0 } else { 0.0 }
                    } else {
                        v
                    }
                })
                .collect(),
        )),
        (Value::Vector(l), Value::Scalar(r)) => vector_scalar(op, l, &r, false, ret_bool),
        (Value::Scalar(l), Value::Vector(r)) => vector_scalar(op, r, &l, true, ret_bool),
        (Value::Vector(l), Value::Vector(r)) => {
            ev.check_deadline("binary operator")?;
            if matches!(op, T_LAND | T_LOR | T_LUNLESS) {
                set_op(op, l, r, &modifier, g)
            } else {
                vector_vector(op, l, r, &modifier, ret_bool, g)
            }
        }
        (l, r) => Err(bad(format!(
            "binary operator {} is not defined between {} and {}",
            b.op,
            l.type_name(),
            r.type_name()
        ))),
    }
}

fn vector_scalar(op: u16, v: Vec<Series>, s: &[f64], swap: bool, ret_bool: bool) -> Result<Value> {
    let drop = drops_name(op) || ret_bool;
    let out: Vec<Series> = v
        .into_iter()
        .map(|series| {
            let vals = series
                .vals
                .iter()
                .zip(s)
                .map(|(x, &sc)| {
                    let x = (*x)?;
                    let (l, r) = if swap { (sc, x) } else { (x, sc) };
                    let (mut value, keep) = apply(op, l, r);
                    if is_comparison(op) && swap {
                        value = r;
                    }
                    if ret_bool {
                        return Some(if keep { 1.0 } else { 0.0 });
                    }
                    keep.then_some(value)
                })
                .collect();
            Series {
                labels: if drop {
                    series.labels.without_name()
                } else {
                    series.labels
                },
                vals,
            }
        })
        .filter(|s| s.vals.iter().any(Option::is_some))
        .collect();
    Ok(Value::Vector(merge_same_labels(out)?))
}

/// The matching signature of a series: the `on` labels' values, or every label but the
/// `ignoring` ones and `__name__`.
fn signature(l: &Labels, m: &Option<LabelModifier>) -> Labels {
    match m {
        Some(LabelModifier::Include(ls)) => l.keep(&ls.labels),
        Some(LabelModifier::Exclude(ls)) => l.drop(&ls.labels).without_name(),
        None => l.without_name(),
    }
}

fn set_op(op: u16, l: Vec<Series>, r: Vec<Series>, m: &BinModifier, g: Grid) -> Result<Value> {
    let lsig: Vec<Labels> = l
        .iter()
        .map(|s| signature(&s.labels, &m.matching))
        .collect();
    let rsig: Vec<Labels> = r
        .iter()
        .map(|s| signature(&s.labels, &m.matching))
        .collect();
    let mut lvals: Vec<Vec<Option<f64>>> = l.iter().map(|_| vec![None; g.len()]).collect();
    let mut rvals: Vec<Vec<Option<f64>>> = r.iter().map(|_| vec![None; g.len()]).collect();
    let mut present: HashMap<&Labels, ()> = HashMap::new();
    for i in 0..g.len() {
        let l_any = l.iter().any(|s| s.vals[i].is_some());
        let r_any = r.iter().any(|s| s.vals[i].is_some());
        match op {
            T_LAND => {
                if !l_any || !r_any {
                    continue;
                }
                present.clear();
                for (s, sig) in r.iter().zip(&rsig) {
                    if s.vals[i].is_some() {
                        present.insert(sig, ());
                    }
                }
                for (n, s) in l.iter().enumerate() {
                    if s.vals[i].is_some() && present.contains_key(&lsig[n]) {
                        lvals[n][i] = s.vals[i];
                    }
                }
            }
            T_LOR => {
                present.clear();
                for (n, s) in l.iter().enumerate() {
                    if s.vals[i].is_some() {
                        present.insert(&lsig[n], ());
                        lvals[n][i] = s.vals[i];
                    }
                }
                for (n, s) in r.iter().enumerate() {
                    if s.vals[i].is_some() && !present.contains_key(&rsig[n]) {
                        rvals[n][i] = s.vals[i];
                    }
                }
            }
            _ => {
                present.clear();
                if r_any {
                    for (s, sig) in r.iter().zip(&rsig) {
                        if s.vals[i].is_some() {
                            present.insert(sig, ());
                        }
                    }
                }
                for (n, s) in l.iter().enumerate() {
                    if s.vals[i].is_some() && !present.contains_key(&lsig[n]) {
                        lvals[n][i] = s.vals[i];
                    }
                }
            }
        }
    }
    let mut out: Vec<Series> = l
        .into_iter()
        .zip(lvals)
        .map(|(s, vals)| Series {
            labels: s.labels,
            vals,
        })
        .chain(r.into_iter().zip(rvals).map(|(s, vals)| Series {
            labels: s.labels,
            vals,
        }))
        .filter(|s| s.vals.iter().any(Option::is_some))
        .collect();
    out = merge_same_labels(out)?;
    Ok(Value::Vector(out))
}

/// The labels of a result: the "many" side's (or the left's), minus the metric name for
/// arithmetic, narrowed by `on`/`ignoring` for one-to-one, plus the `group_x` labels from the
/// "one" side.
fn result_labels(
    many: &Labels,
    one: &Labels,
    op: u16,
    m: &BinModifier,
    include: &[String],
) -> Labels {
    let mut l = if drops_name(op) {
        many.without_name()
    } else {
        many.clone()
    };
    if matches!(m.card, VectorMatchCardinality::OneToOne) {
        match &m.matching {
            Some(LabelModifier::Include(ls)) => l = l.keep(&ls.labels),
            Some(LabelModifier::Exclude(ls)) => l = l.drop(&ls.labels),
            None => {}
        }
    }
    for name in include {
        l = l.with(name, one.get(name));
    }
    l
}

/// The `group_x` labels to copy from the "one" side, and whether the "many" side is the right
/// one (`group_right`); an error for many-to-many, which only the set operators allow.
fn grouping(m: &BinModifier) -> Result<(Vec<String>, bool)> {
    match &m.card {
        VectorMatchCardinality::ManyToOne(ls) => Ok((ls.labels.clone(), false)),
        VectorMatchCardinality::OneToMany(ls) => Ok((ls.labels.clone(), true)),
        VectorMatchCardinality::OneToOne => Ok((Vec::new(), false)),
        VectorMatchCardinality::ManyToMany => {
            Err(bad("many-to-many matching is only for and, or and unless"))
        }
    }
}

/// Indexes the "one" side's series present at step `i` by signature into `ones`; an error when
/// two of them share a signature.
fn index_one_side<'a>(
    one: &[Series],
    osig: &'a [Labels],
    i: usize,
    swap: bool,
    ones: &mut HashMap<&'a Labels, usize>,
) -> Result<()> {
    ones.clear();
    for (n, s) in one.iter().enumerate() {
        if s.vals[i].is_none() {
            continue;
        }
        if let Some(&prev) = ones.get(&osig[n]) {
            let side = if swap { "left" } else { "right" };
            return Err(exec(format!(
                "found duplicate series for the match group {} on the {side} hand-side of the operation: [{}, {}];many-to-many matching not allowed: matching labels must be unique on one side",
                osig[n], s.labels, one[prev].labels
            )));
        }
        ones.insert(&osig[n], n);
    }
    Ok(())
}

/// The value of one matched pair (`mv` from the "many" side, `ov` from the "one" side), or
/// `None` when a comparison without `bool` filters it out.
fn combine(op: u16, mv: f64, ov: f64, swap: bool, ret_bool: bool) -> Option<f64> {
    let (vl, vr) = if swap { (ov, mv) } else { (mv, ov) };
    let (value, keep) = apply(op, vl, vr);
    if ret_bool {
        return Some(if keep { 1.0 } else { 0.0 });
    }
    keep.then_some(value)
}

/// Records that a "many" series' signature matched into output `slot` at this step; an error
/// when one-to-one matching meets a second match, or two matches land in the same output.
fn record_match(seen: &mut Vec<usize>, slot: usize, one_to_one: bool) -> Result<()> {
    if one_to_one && !seen.is_empty() {
        return Err(exec(
            "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)",
        ));
    }
    if seen.contains(&slot) {
        return Err(exec(
            "multiple matches for labels: grouping labels must ensure unique matches",
        ));
    }
    seen.push(slot);
    Ok(())
}

/// The result series of a vector-vector operation, found by labels and by matched pair.
struct Outputs {
    series: Vec<Series>,
    by_labels: HashMap<Labels, usize>,
    by_pair: HashMap<(usize, usize), usize>,
    steps: usize,
}

impl Outputs {
    /// No result series yet, on a grid of `steps` steps.
    fn new(steps: usize) -> Self {
        Self {
            series: Vec::new(),
            by_labels: HashMap::new(),
            by_pair: HashMap::new(),
            steps,
        }
    }

    /// The result series of `pair` (many-side index, one-side index), created with the labels
    /// `labels()` gives (or joined to the series that already has them) on first use.
    fn slot(&mut self, pair: (usize, usize), labels: impl FnOnce() -> Labels) -> usize {
        if let Some(&slot) = self.by_pair.get(&pair) {
            return slot;
        }
        let labels = labels();
        let next = self.series.len();
        let (series, steps) = (&mut self.series, self.steps);
        let slot = *self.by_labels.entry(labels.clone()).or_insert_with(|| {
            series.push(Series {
                labels,
                vals: vec![None; steps],
            });
            next
        });
        self.by_pair.insert(pair, slot);
        slot
    }

    /// Writes `value` at step `i` of `slot`; an error when two pairs gave that series a value
    /// at the same step.
    fn set(&mut self, slot: usize, i: usize, value: f64) -> Result<()> {
        let series = &mut self.series[slot];
        if series.vals[i].is_some() {
            return Err(exec(format!(
                "vector cannot contain metrics with the same labelset: {}",
                series.labels
            )));
        }
        series.vals[i] = Some(value);
        Ok(())
    }
}

/// Arithmetic and comparison between two vectors, step by step, with vector matching.
fn vector_vector(
    op: u16,
    l: Vec<Series>,
    r: Vec<Series>,
    m: &BinModifier,
    ret_bool: bool,
    g: Grid,
) -> Result<Value> {
    let (include, swap) = grouping(m)?;
    let one_to_one = matches!(m.card, VectorMatchCardinality::OneToOne);
    // `many` is the side whose series are kept; `one` the side matched against.
    let (many, one) = if swap { (r, l) } else { (l, r) };
    let msig: Vec<Labels> = many
        .iter()
        .map(|s| signature(&s.labels, &m.matching))
        .collect();
    let osig: Vec<Labels> = one
        .iter()
        .map(|s| signature(&s.labels, &m.matching))
        .collect();
    let mut out = Outputs::new(g.len());
    let mut ones: HashMap<&Labels, usize> = HashMap::new();
    let mut matched: HashMap<&Labels, Vec<usize>> = HashMap::new();
    for i in 0..g.len() {
        index_one_side(&one, &osig, i, swap, &mut ones)?;
        if ones.is_empty() {
            continue;
        }
        matched.clear();
        for (n, s) in many.iter().enumerate() {
            let Some(mv) = s.vals[i] else { continue };
            let Some(&o) = ones.get(&msig[n]) else {
                continue;
            };
            let ov = one[o].vals[i].unwrap_or(f64::NAN);
            let Some(value) = combine(op, mv, ov, swap, ret_bool) else {
                continue;
            };
            let slot = out.slot((n, o), || {
                let labels = result_labels(&s.labels, &one[o].labels, op, m, &include);
                if ret_bool {
                    labels.without_name()
                } else {
                    labels
                }
            });
            record_match(matched.entry(&msig[n]).or_default(), slot, one_to_one)?;
            out.set(slot, i, value)?;
        }
    }
    Ok(Value::Vector(out.series))
}
