//! PromQL's functions, as Prometheus 2.42 computes them.

use promql_parser::label::MatchOp;
use promql_parser::parser::{Call, Expr};

use crate::error::{Result, bad, exec};
use crate::eval::{Evaluator, Grid, Series, Value, Windowed, check_unique, merge_same_labels};
use crate::labels::{Labels, NAME};
use crate::rangefn;

/// Evaluates a function call at every step of `g`.
pub async fn call(ev: &Evaluator<'_>, c: &Call, g: Grid) -> Result<Value> {
    let name = c.func.name;
    let args: Vec<&Expr> = c.args.args.iter().map(|a| a.as_ref()).collect();
    if let Some(f) = rangefn::lookup(name) {
        return range_call(ev, name, f, &args, g).await;
    }
    match name {
        "time" => Ok(Value::Scalar(
            (0..g.len()).map(|i| g.at(i) as f64 / 1000.0).collect(),
        )),
        "pi" => Ok(Value::Scalar(vec![std::f64::consts::PI; g.len()])),
        "vector" => {
            let s = scalar_arg(ev, args.first().copied(), g).await?;
            Ok(Value::Vector(vec![Series {
                labels: Labels::default(),
                vals: s.into_iter().map(Some).collect(),
            }]))
        }
        "scalar" => {
            let v = vector_arg(ev, args.first().copied(), g).await?;
            let mut out = vec![f64::NAN; g.len()];
            for (i, o) in out.iter_mut().enumerate() {
                let mut present = v.iter().filter_map(|s| s.vals[i]);
                if let (Some(x), None) = (present.next(), present.next()) {
                    *o = x;
                }
            }
            Ok(Value::Scalar(out))
        }
        "timestamp" => timestamp(ev, &args, g).await,
        "sort" | "sort_desc" => {
            let mut v = vector_arg(ev, args.first().copied(), g).await?;
            if g.len() == 1 {
                let desc = name == "sort_desc";
                v.sort_by(|a, b| {
                    let (x, y) = (a.vals[0].unwrap_or(f64::NAN), b.vals[0].unwrap_or(f64::NAN));
                    let o = if desc {
                        y.partial_cmp(&x)
                    } else {
                        x.partial_cmp(&y)
                    };
                    // NaN goes last either way.
                    o.unwrap_or_else(|| x.is_nan().cmp(&y.is_nan()))
                });
            }
            Ok(Value::Vector(v))
        }
        "label_replace" => label_replace(ev, &args, g).await,
        "label_join" => label_join(ev, &args, g).await,
        "absent" => absent(ev, &args, g).await,
        "histogram_quantile" => crate::aggregate::histogram_quantile(ev, &args, g).await,
        "clamp" | "clamp_min" | "clamp_max" | "round" => clamp_like(ev, name, &args, g).await,
        "day_of_month" | "day_of_week" | "day_of_year" | "days_in_month" | "hour" | "minute"
        | "month" | "year" => date_part(ev, name, &args, g).await,
        _ => match simple(name) {
            Some(f) => {
                let v = vector_arg(ev, args.first().copied(), g).await?;
                map_values(v, f)
            }
            None => Err(bad(format!(
                "function {name}() is not supported by gpuwatch (docs/promql.md lists what is)"
            ))),
        },
    }
}

/// The instant-vector functions that map each value on its own.
fn simple(name: &str) -> Option<fn(f64) -> f64> {
    Some(match name {
        "abs" => f64::abs,
        "ceil" => f64::ceil,
        "floor" => f64::floor,
        "exp" => f64::exp,
        "ln" => f64::ln,
        "log2" => f64::log2,
        "log10" => f64::log10,
        "sqrt" => f64::sqrt,
        "sgn" => |x: f64| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        },
        "acos" => f64::acos,
        "acosh" => f64::acosh,
        "asin" => f64::asin,
        "asinh" => f64::asinh,
        "atan" => f64::atan,
        "atanh" => f64::atanh,
        "cos" => f64::cos,
        "cosh" => f64::cosh,
        "sin" => f64::sin,
        "sinh" => f64::sinh,
        "tan" => f64::tan,
        "tanh" => f64::tanh,
        "deg" => |x: f64| x * 180.0 / std::f64::consts::PI,
        "rad" => |x: f64| x * std::f64::consts::PI / 180.0,
        _ => return None,
    })
}

/// The names of every function gpuwatch evaluates.
pub const SUPPORTED: &[&str] = &[
    "abs",
    "absent",
    "absent_over_time",
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atanh",
    "avg_over_time",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "cos",
    "cosh",
    "count_over_time",
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "days_in_month",
    "deg",
    "delta",
    "deriv",
    "exp",
    "floor",
    "histogram_quantile",
    "holt_winters",
    "hour",
    "idelta",
    "increase",
    "irate",
    "label_join",
    "label_replace",
    "last_over_time",
    "ln",
    "log10",
    "log2",
    "max_over_time",
    "min_over_time",
    "minute",
    "month",
    "pi",
    "predict_linear",
    "present_over_time",
    "quantile_over_time",
    "rad",
    "rate",
    "resets",
    "round",
    "scalar",
    "sgn",
    "sin",
    "sinh",
    "sort",
    "sort_desc",
    "sqrt",
    "stddev_over_time",
    "stdvar_over_time",
    "sum_over_time",
    "tan",
    "tanh",
    "time",
    "timestamp",
    "vector",
    "year",
];

fn map_values(v: Vec<Series>, f: fn(f64) -> f64) -> Result<Value> {
    let out: Vec<Series> = v
        .into_iter()
        .map(|s| Series {
            labels: s.labels.without_name(),
            vals: s.vals.into_iter().map(|x| x.map(f)).collect(),
        })
        .collect();
    Ok(Value::Vector(merge_same_labels(out)?))
}

/// An instant-vector argument.
pub(crate) async fn vector_arg(
    ev: &Evaluator<'_>,
    e: Option<&Expr>,
    g: Grid,
) -> Result<Vec<Series>> {
    let e = e.ok_or_else(|| bad("missing instant-vector argument"))?;
    match ev.eval(e, g).await? {
        Value::Vector(v) => Ok(v),
        other => Err(bad(format!(
            "expected an instant vector argument, got {}",
            other.type_name()
        ))),
    }
}

/// A scalar argument, one value per step.
pub(crate) async fn scalar_arg(ev: &Evaluator<'_>, e: Option<&Expr>, g: Grid) -> Result<Vec<f64>> {
    let e = e.ok_or_else(|| bad("missing scalar argument"))?;
    match ev.eval(e, g).await? {
        Value::Scalar(v) => Ok(v),
        other => Err(bad(format!(
            "expected a scalar argument, got {}",
            other.type_name()
        ))),
    }
}

/// A string argument.
pub(crate) fn string_arg(e: Option<&Expr>) -> Result<String> {
    match e {
        Some(Expr::StringLiteral(s)) => Ok(s.val.clone()),
        Some(Expr::Paren(p)) => string_arg(Some(&p.expr)),
        _ => Err(bad("expected a string literal argument")),
    }
}

async fn range_call(
    ev: &Evaluator<'_>,
    name: &str,
    f: rangefn::RangeFn,
    args: &[&Expr],
    g: Grid,
) -> Result<Value> {
    // The range argument is the first, but for quantile_over_time (the second).
    let (w_pos, params): (usize, Vec<usize>) = match name {
        "quantile_over_time" => (1, vec![0]),
        "predict_linear" => (0, vec![1]),
        "holt_winters" => (0, vec![1, 2]),
        _ => (0, vec![]),
    };
    let w_expr = args
        .get(w_pos)
        .ok_or_else(|| bad(format!("{name}() needs a range-vector argument")))?;
    let mut scalars = Vec::new();
    for p in params {
        scalars.push(scalar_arg(ev, args.get(p).copied(), g).await?);
    }
    let w = ev.range_arg(w_expr, g).await?;
    if name == "absent_over_time" {
        return Ok(absent_over_time(&w, w_expr, g));
    }
    let out = rangefn::apply(ev, &w, g, f, &scalars, name == "last_over_time")?;
    check_unique(&out)?;
    Ok(Value::Vector(out))
}

async fn timestamp(ev: &Evaluator<'_>, args: &[&Expr], g: Grid) -> Result<Value> {
    let mut e = args
        .first()
        .copied()
        .ok_or_else(|| bad("timestamp() needs an argument"))?;
    while let Expr::Paren(p) = e {
        e = &p.expr;
    }
    let v = match e {
        Expr::VectorSelector(vs) => ev.instant_selector(vs, g, true).await?,
        _ => {
            let v = vector_arg(ev, Some(e), g).await?;
            v.into_iter()
                .map(|s| Series {
                    vals: s
                        .vals
                        .iter()
                        .enumerate()
                        .map(|(i, x)| x.map(|_| g.at(i) as f64 / 1000.0))
                        .collect(),
                    labels: s.labels,
                })
                .collect()
        }
    };
    let out: Vec<Series> = v
        .into_iter()
        .map(|s| Series {
            labels: s.labels.without_name(),
            vals: s.vals,
        })
        .collect();
    Ok(Value::Vector(merge_same_labels(out)?))
}

async fn clamp_like(ev: &Evaluator<'_>, name: &str, args: &[&Expr], g: Grid) -> Result<Value> {
    let v = vector_arg(ev, args.first().copied(), g).await?;
    let (a, b) = match name {
        "clamp" => (
            scalar_arg(ev, args.get(1).copied(), g).await?,
            scalar_arg(ev, args.get(2).copied(), g).await?,
        ),
        "round" => match args.get(1) {
            Some(e) => (scalar_arg(ev, Some(e), g).await?, Vec::new()),
            None => (vec![1.0; g.len()], Vec::new()),
        },
        _ => (scalar_arg(ev, args.get(1).copied(), g).await?, Vec::new()),
    };
    let out: Vec<Series> = v
        .into_iter()
        .map(|s| Series {
            labels: s.labels.without_name(),
            vals: s
                .vals
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    let x = (*x)?;
                    match name {
                        "clamp" => {
                            let (lo, hi) = (a[i], b[i]);
                            (hi >= lo || lo.is_nan() || hi.is_nan())
                                .then(|| go_max(lo, go_min(hi, x)))
                        }
                        "clamp_min" => Some(go_max(a[i], x)),
                        "clamp_max" => Some(go_min(a[i], x)),
                        _ => {
                            let inv = 1.0 / a[i];
                            Some((x * inv + 0.5).floor() / inv)
                        }
                    }
                })
                .collect(),
        })
        .collect();
    Ok(Value::Vector(merge_same_labels(out)?))
}

/// Go's `math.Max`: NaN when either is NaN.
pub(crate) fn go_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// Go's `math.Min`: NaN when either is NaN.
pub(crate) fn go_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

async fn date_part(ev: &Evaluator<'_>, name: &str, args: &[&Expr], g: Grid) -> Result<Value> {
    let v = match args.first() {
        Some(e) => vector_arg(ev, Some(e), g).await?,
        None => vec![Series {
            labels: Labels::default(),
            vals: (0..g.len())
                .map(|i| Some(g.at(i) as f64 / 1000.0))
                .collect(),
        }],
    };
    let f = |secs: f64| -> f64 {
        let t = secs.floor() as i64;
        let days = t.div_euclid(86_400);
        let rem = t.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        match name {
            "day_of_month" => d as f64,
            "day_of_week" => (days + 4).rem_euclid(7) as f64,
            "day_of_year" => (days - days_from_civil(y, 1, 1) + 1) as f64,
            "days_in_month" => {
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                (days_from_civil(ny, nm, 1) - days_from_civil(y, m, 1)) as f64
            }
            "hour" => (rem / 3600) as f64,
            "minute" => (rem % 3600 / 60) as f64,
            "month" => m as f64,
            _ => y as f64,
        }
    };
    let out: Vec<Series> = v
        .into_iter()
        .map(|s| Series {
            labels: s.labels.without_name(),
            vals: s.vals.into_iter().map(|x| x.map(&f)).collect(),
        })
        .collect();
    Ok(Value::Vector(merge_same_labels(out)?))
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn valid_label_name(n: &str) -> bool {
    let mut c = n.chars();
    matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

async fn label_replace(ev: &Evaluator<'_>, args: &[&Expr], g: Grid) -> Result<Value> {
    let v = vector_arg(ev, args.first().copied(), g).await?;
    let dst = string_arg(args.get(1).copied())?;
    let repl = string_arg(args.get(2).copied())?;
    let src = string_arg(args.get(3).copied())?;
    let re = string_arg(args.get(4).copied())?;
    let regex = regex::Regex::new(&format!("^(?s:{re})$")).map_err(|e| {
        bad(format!(
            "invalid regular expression in label_replace(): {e}"
        ))
    })?;
    if !valid_label_name(&dst) {
        return Err(bad(format!(
            "invalid destination label name in label_replace(): {dst}"
        )));
    }
    let out: Vec<Series> = v
        .into_iter()
        .map(|s| {
            let value = s.labels.get(&src).to_string();
            let labels = match regex.captures(&value) {
                Some(caps) => {
                    let mut res = String::new();
                    caps.expand(&go_template(&repl), &mut res);
                    s.labels.with(&dst, &res)
                }
                None => s.labels.clone(),
            };
            Series {
                labels,
                vals: s.vals,
            }
        })
        .collect();
    Ok(Value::Vector(merge_same_labels(out)?))
}

/// Go's `$1`/`${name}` expansion differs from the regex crate's only in that `$1x` means the
/// group named `1x` in both; nothing to translate but `$$`, which both read as `$`.
fn go_template(repl: &str) -> String {
    repl.to_string()
}

async fn label_join(ev: &Evaluator<'_>, args: &[&Expr], g: Grid) -> Result<Value> {
    let v = vector_arg(ev, args.first().copied(), g).await?;
    let dst = string_arg(args.get(1).copied())?;
    let sep = string_arg(args.get(2).copied())?;
    let mut srcs = Vec::new();
    for a in args.iter().skip(3) {
        srcs.push(string_arg(Some(a))?);
    }
    if !valid_label_name(&dst) {
        return Err(bad(format!(
            "invalid destination label name in label_join(): {dst}"
        )));
    }
    let out: Vec<Series> = v
        .into_iter()
        .map(|s| {
            let joined: Vec<&str> = srcs.iter().map(|n| s.labels.get(n)).collect();
            Series {
                labels: s.labels.with(&dst, &joined.join(&sep)),
                vals: s.vals,
            }
        })
        .collect();
    Ok(Value::Vector(merge_same_labels(out)?))
}

/// The labels `absent()` gives: the equality matchers of a selector argument (a label with more
/// than one equality matcher is left out), without `__name__`.
fn absent_labels(e: &Expr) -> Labels {
    let mut e = e;
    loop {
        match e {
            Expr::Paren(p) => e = &p.expr,
            Expr::MatrixSelector(m) => return absent_labels(&Expr::VectorSelector(m.vs.clone())),
            Expr::VectorSelector(vs) => {
                let mut pairs: Vec<(String, String)> = Vec::new();
                let mut dup: Vec<String> = Vec::new();
                for m in &vs.matchers.matchers {
                    if m.name == NAME || m.op != MatchOp::Equal {
                        continue;
                    }
                    if pairs.iter().any(|(n, _)| *n == m.name) {
                        dup.push(m.name.clone());
                    }
                    pairs.push((m.name.clone(), m.value.clone()));
                }
                pairs.retain(|(n, _)| !dup.contains(n));
                return Labels::new(pairs);
            }
            _ => return Labels::default(),
        }
    }
}

async fn absent(ev: &Evaluator<'_>, args: &[&Expr], g: Grid) -> Result<Value> {
    let e = args
        .first()
        .copied()
        .ok_or_else(|| bad("absent() needs an argument"))?;
    let v = vector_arg(ev, Some(e), g).await?;
    let vals: Vec<Option<f64>> = (0..g.len())
        .map(|i| (!v.iter().any(|s| s.vals[i].is_some())).then_some(1.0))
        .collect();
    if vals.iter().all(Option::is_none) {
        return Ok(Value::Vector(Vec::new()));
    }
    Ok(Value::Vector(vec![Series {
        labels: absent_labels(e),
        vals,
    }]))
}

fn absent_over_time(w: &Windowed, e: &Expr, g: Grid) -> Value {
    let vals: Vec<Option<f64>> = (0..g.len())
        .map(|i| {
            let (lo, hi) = w.window(g.at(i));
            let any = w.series.iter().any(|s| {
                let (a, b) = crate::eval::bounds(&s.t, lo, hi);
                a < b
            });
            (!any).then_some(1.0)
        })
        .collect();
    if vals.iter().all(Option::is_none) {
        return Value::Vector(Vec::new());
    }
    Value::Vector(vec![Series {
        labels: absent_labels(e),
        vals,
    }])
}

/// Fails unless a query's result is of a type a range query can return.
pub fn check_range_result(v: &Value) -> Result<()> {
    match v {
        Value::Scalar(_) | Value::Vector(_) => Ok(()),
        other => Err(exec(format!(
            "invalid expression type \"{}\" for range query, must be Scalar or instant Vector",
            other.type_name()
        ))),
    }
}
