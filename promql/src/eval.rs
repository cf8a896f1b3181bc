//! The evaluator: an expression evaluated at every step of a grid at once (an instant query is a
//! grid of one step), each node a set of series with one optional value per step.
//!
//! Selectors load their samples once for the whole grid ([`crate::select`]); every function,
//! aggregation and operator then works step by step in memory, one pass per series.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use gpuwatch_query::QueryEngine;
use promql_parser::parser::{AtModifier, Expr, Offset, SubqueryExpr, VectorSelector};

use crate::error::{Error, Result, bad, exec};
use crate::labels::Labels;
use crate::select::{self, Budget, RawSeries};

/// Timestamps `start, start + step, …, end` (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    /// First step (ms).
    pub start: i64,
    /// Last step (ms), `start + k * step`.
    pub end: i64,
    /// Step (ms), at least 1.
    pub step: i64,
}

impl Grid {
    /// The grid from `start` to `end` by `step` (the last step at or before `end`).
    pub fn new(start: i64, end: i64, step: i64) -> Self {
        let step = step.max(1);
        let n = (end - start).max(0) / step;
        Self {
            start,
            end: start + n * step,
            step,
        }
    }

    /// One step at `t`.
    pub fn instant(t: i64) -> Self {
        Self::new(t, t, 1)
    }

    /// The number of steps.
    pub fn len(&self) -> usize {
        ((self.end - self.start) / self.step + 1) as usize
    }

    /// Never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The time of step `i`.
    pub fn at(&self, i: usize) -> i64 {
        self.start + i as i64 * self.step
    }
}

/// A series of an instant-vector result: one optional value per step.
#[derive(Debug, Clone)]
pub struct Series {
    /// Its labels.
    pub labels: Labels,
    /// One value per step of the grid.
    pub vals: Vec<Option<f64>>,
}

/// What an expression evaluates to.
#[derive(Debug, Clone)]
pub enum Value {
    /// One number per step.
    Scalar(Vec<f64>),
    /// Series with a value at some steps.
    Vector(Vec<Series>),
    /// A string literal.
    Str(String),
    /// Raw samples (an instant query of a range selector or subquery).
    Matrix(Vec<RawSeries>),
}

impl Value {
    /// The type's name, as Prometheus writes it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Scalar(_) => "scalar",
            Value::Vector(_) => "vector",
            Value::Str(_) => "string",
            Value::Matrix(_) => "matrix",
        }
    }
}

/// Samples of a range selector or subquery and how each step windows them.
#[derive(Debug)]
pub struct Windowed {
    /// The series, each with its samples.
    pub series: Vec<RawSeries>,
    /// The window's length (ms).
    pub range: i64,
    /// Its offset (ms).
    pub offset: i64,
    /// Its `@` time, if any (ms).
    pub at: Option<i64>,
}

impl Windowed {
    /// The window `[ref - range, ref]` of step time `ts`, as (start, end).
    pub fn window(&self, ts: i64) -> (i64, i64) {
        let end = self.at.unwrap_or(ts) - self.offset;
        (end - self.range, end)
    }
}

/// Settings of one evaluation.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How far back an instant selector looks for a sample (ms).
    pub lookback: i64,
    /// The step of a subquery without one (ms).
    pub subquery_step: i64,
    /// Samples one query may load.
    pub max_samples: usize,
    /// How long the evaluation may take.
    pub timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            lookback: 5 * 60 * 1000,
            subquery_step: 60 * 1000,
            max_samples: 50_000_000,
            timeout: Duration::from_secs(120),
        }
    }
}

/// One query's evaluation.
pub struct Evaluator<'a> {
    pub(crate) engine: &'a QueryEngine,
    pub(crate) settings: Settings,
    budget: Budget,
    deadline: Instant,
    /// The query's own start and end (for `@ start()` / `@ end()`).
    query_start: i64,
    query_end: i64,
}

impl std::fmt::Debug for Evaluator<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Evaluator")
            .field("settings", &self.settings)
            .field("query_start", &self.query_start)
            .field("query_end", &self.query_end)
            .finish_non_exhaustive()
    }
}

/// Milliseconds since the epoch of a `SystemTime` (negative before 1970).
pub fn system_ms(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

pub(crate) fn offset_ms(o: &Option<Offset>) -> i64 {
    match o {
        None => 0,
        Some(Offset::Pos(d)) => d.as_millis() as i64,
        Some(Offset::Neg(d)) => -(d.as_millis() as i64),
    }
}

impl<'a> Evaluator<'a> {
    /// An evaluation of a query over `[start, end]`.
    pub fn new(engine: &'a QueryEngine, settings: Settings, start: i64, end: i64) -> Self {
        let deadline = Instant::now() + settings.timeout;
        Self {
            engine,
            budget: Budget::new(settings.max_samples),
            settings,
            deadline,
            query_start: start,
            query_end: end,
        }
    }

    /// The warnings of the evaluation's reads so far (damaged files left out).
    pub fn warnings(&self) -> Vec<String> {
        self.budget.warnings()
    }

    /// Fails once the time limit has passed.
    pub(crate) fn check_deadline(&self, stage: &'static str) -> Result<()> {
        if Instant::now() > self.deadline {
            return Err(Error::Timeout(stage));
        }
        Ok(())
    }

    pub(crate) fn at_ms(&self, at: &Option<AtModifier>) -> Option<i64> {
        match at {
            None => None,
            Some(AtModifier::Start) => Some(self.query_start),
            Some(AtModifier::End) => Some(self.query_end),
            Some(AtModifier::At(t)) => Some(system_ms(*t)),
        }
    }

    /// Evaluates `e` at every step of `g`.
    pub fn eval<'b>(&'b self, e: &'b Expr, g: Grid) -> BoxFuture<'b, Result<Value>> {
        Box::pin(async move {
            self.check_deadline("evaluation")?;
            match e {
                Expr::NumberLiteral(n) => Ok(Value::Scalar(vec![n.val; g.len()])),
                Expr::StringLiteral(s) => Ok(Value::Str(s.val.clone())),
                Expr::Paren(p) => self.eval(&p.expr, g).await,
                Expr::Unary(u) => Ok(negate(self.eval(&u.expr, g).await?)),
                Expr::VectorSelector(vs) => {
                    Ok(Value::Vector(self.instant_selector(vs, g, false).await?))
                }
                Expr::MatrixSelector(_) | Expr::Subquery(_) => Err(bad(format!(
                    "invalid expression type \"range vector\" here: {e} must be the argument of a function such as rate() or an instant query"
                ))),
                Expr::Call(c) => crate::functions::call(self, c, g).await,
                Expr::Aggregate(a) => crate::aggregate::eval(self, a, g).await,
                Expr::Binary(b) => crate::binary::eval(self, b, g).await,
                Expr::Extension(_) => Err(bad("extension expressions are not supported")),
            }
        })
    }

    /// Evaluates the top of an instant query: a range selector or subquery gives raw samples.
    pub async fn eval_instant_top(&self, e: &Expr, t: i64) -> Result<Value> {
        match e {
            Expr::MatrixSelector(_) | Expr::Subquery(_) => {
                let w = self.range_arg(e, Grid::instant(t)).await?;
                let (lo, hi) = w.window(t);
                let mut out = Vec::new();
                for s in w.series {
                    let (a, b) = bounds(&s.t, lo, hi);
                    if a < b {
                        out.push(RawSeries {
                            labels: s.labels,
                            t: s.t[a..b].to_vec(),
                            v: s.v[a..b].to_vec(),
                            stale: Vec::new(),
                        });
                    }
                }
                Ok(Value::Matrix(out))
            }
            Expr::Paren(p) if matches!(*p.expr, Expr::MatrixSelector(_) | Expr::Subquery(_)) => {
                Box::pin(self.eval_instant_top(&p.expr, t)).await
            }
            _ => self.eval(e, Grid::instant(t)).await,
        }
    }

    /// Loads the samples of a selector in `[min, max]`.
    pub(crate) async fn load(
        &self,
        vs: &VectorSelector,
        min: i64,
        max: i64,
        steps: Option<select::Steps>,
    ) -> Result<Vec<RawSeries>> {
        if !vs.matchers.or_matchers.is_empty() {
            return Err(bad(
                "the \"or\" form of label matchers is not supported (Prometheus 2.42 has none)",
            ));
        }
        let matchers = select::all_matchers(vs.name.as_deref(), &vs.matchers.matchers);
        let out = select::select(self.engine, &matchers, min, max, &self.budget, steps).await?;
        self.check_deadline("selection")?;
        Ok(out)
    }

    /// An instant selector: at each step the latest sample in `[ref - lookback, ref]`. With
    /// `times`, the sample's time (s) instead of its value (for `timestamp()`).
    pub(crate) async fn instant_selector(
        &self,
        vs: &VectorSelector,
        g: Grid,
        times: bool,
    ) -> Result<Vec<Series>> {
        let offset = offset_ms(&vs.offset);
        let at = self.at_ms(&vs.at);
        let lb = self.settings.lookback;
        let (lo, hi) = match at {
            Some(a) => (a - offset - lb, a - offset),
            None => (g.start - offset - lb, g.end - offset),
        };
        let steps = match at {
            Some(a) => select::Steps::new(a - offset, 1, a - offset),
            None => select::Steps::new(g.start - offset, g.step, g.end - offset),
        };
        let raw = self.load(vs, lo, hi, Some(steps)).await?;
        let mut out = Vec::with_capacity(raw.len());
        for s in raw {
            let mut vals = vec![None; g.len()];
            let (mut j, mut k) = (0usize, 0usize);
            for (i, v) in vals.iter_mut().enumerate() {
                let r = at.unwrap_or(g.at(i)) - offset;
                if at.is_some() {
                    (j, k) = (0, 0);
                }
                while j < s.t.len() && s.t[j] <= r {
                    j += 1;
                }
                while k < s.stale.len() && s.stale[k] <= r {
                    k += 1;
                }
                // The latest thing at or before `r` is a stale marker: no value.
                let stale = k > 0 && (j == 0 || s.stale[k - 1] > s.t[j - 1]);
                if j > 0 && !stale && s.t[j - 1] >= r - lb {
                    *v = Some(if times {
                        s.t[j - 1] as f64 / 1000.0
                    } else {
                        s.v[j - 1]
                    });
                }
            }
            if vals.iter().any(Option::is_some) {
                out.push(Series {
                    labels: s.labels,
                    vals,
                });
            }
        }
        Ok(out)
    }

    /// The samples a range selector or subquery gives for the steps of `g`.
    pub(crate) async fn range_arg(&self, e: &Expr, g: Grid) -> Result<Windowed> {
        match e {
            Expr::Paren(p) => Box::pin(self.range_arg(&p.expr, g)).await,
            Expr::MatrixSelector(ms) => {
                let vs = &ms.vs;
                let range = ms.range.as_millis() as i64;
                let offset = offset_ms(&vs.offset);
                let at = self.at_ms(&vs.at);
                let (lo, hi) = match at {
                    Some(a) => (a - offset - range, a - offset),
                    None => (g.start - offset - range, g.end - offset),
                };
                let series = self.load(vs, lo, hi, None).await?;
                Ok(Windowed {
                    series,
                    range,
                    offset,
                    at,
                })
            }
            Expr::Subquery(sq) => self.subquery(sq, g).await,
            other => Err(bad(format!(
                "expected a range vector (a selector with [range] or a subquery), got {other}"
            ))),
        }
    }

    async fn subquery(&self, sq: &SubqueryExpr, g: Grid) -> Result<Windowed> {
        let range = sq.range.as_millis() as i64;
        let offset = offset_ms(&sq.offset);
        let at = self.at_ms(&sq.at);
        let step = match sq.step {
            Some(s) if !s.is_zero() => s.as_millis() as i64,
            _ => self.settings.subquery_step,
        }
        .max(1);
        let (first, last) = match at {
            Some(a) => (a, a),
            None => (g.start, g.end),
        };
        let lo = first - offset - range;
        let mut start = step * lo.div_euclid(step);
        if start < lo {
            start += step;
        }
        let end = last - offset;
        if end < start {
            return Ok(Windowed {
                series: Vec::new(),
                range,
                offset,
                at,
            });
        }
        let inner = Grid::new(start, end, step);
        if inner.len() > 11_000 * 100 {
            return Err(exec(format!(
                "the subquery {sq} would evaluate {} steps: raise its step",
                inner.len()
            )));
        }
        let v = self.eval(&sq.expr, inner).await?;
        let series = match v {
            Value::Vector(vs) => vs
                .into_iter()
                .map(|s| {
                    let mut r = RawSeries {
                        labels: s.labels,
                        ..RawSeries::default()
                    };
                    for (i, v) in s.vals.iter().enumerate() {
                        if let Some(v) = v {
                            r.t.push(inner.at(i));
                            r.v.push(*v);
                        }
                    }
                    r
                })
                .collect(),
            Value::Scalar(vals) => vec![RawSeries {
                labels: Labels::default(),
                t: (0..inner.len()).map(|i| inner.at(i)).collect(),
                v: vals,
                stale: Vec::new(),
            }],
            other => {
                return Err(bad(format!(
                    "a subquery needs an instant vector or scalar inside, got {}",
                    other.type_name()
                )));
            }
        };
        Ok(Windowed {
            series,
            range,
            offset,
            at,
        })
    }
}

/// The index range of the times in `[lo, hi]` of sorted `t`.
pub fn bounds(t: &[i64], lo: i64, hi: i64) -> (usize, usize) {
    let a = t.partition_point(|&x| x < lo);
    let b = t.partition_point(|&x| x <= hi);
    (a, b.max(a))
}

/// `-x`: a scalar's values, or a vector's values without the metric name.
fn negate(v: Value) -> Value {
    match v {
        Value::Scalar(s) => Value::Scalar(s.into_iter().map(|x| -x).collect()),
        Value::Vector(vs) => Value::Vector(
            vs.into_iter()
                .map(|s| Series {
                    labels: s.labels.without_name(),
                    vals: s.vals.into_iter().map(|v| v.map(|x| -x)).collect(),
                })
                .collect(),
        ),
        other => other,
    }
}

/// Fails when two series of a result share a label set (Prometheus's rule).
pub fn check_unique(series: &[Series]) -> Result<()> {
    let mut seen = std::collections::HashSet::with_capacity(series.len());
    for s in series {
        if !seen.insert(&s.labels) {
            return Err(exec(format!(
                "vector cannot contain metrics with the same labelset: {}",
                s.labels
            )));
        }
    }
    Ok(())
}

/// Merges series with the same labels whose values never meet at a step (what Prometheus's
/// step-wise evaluation does); fails when two have a value at one step.
pub fn merge_same_labels(series: Vec<Series>) -> Result<Vec<Series>> {
    let mut index: std::collections::HashMap<Labels, usize> =
        std::collections::HashMap::with_capacity(series.len());
    let mut out: Vec<Series> = Vec::with_capacity(series.len());
    for s in series {
        match index.get(&s.labels) {
            None => {
                index.insert(s.labels.clone(), out.len());
                out.push(s);
            }
            Some(&i) => {
                let target = &mut out[i];
                for (a, b) in target.vals.iter_mut().zip(s.vals) {
                    match (a.is_some(), b) {
                        (true, Some(_)) => {
                            return Err(exec(format!(
                                "vector cannot contain metrics with the same labelset: {}",
                                s.labels
                            )));
                        }
                        (false, Some(v)) => *a = Some(v),
                        _ => {}
                    }
                }
            }
        }
    }
    Ok(out)
}
