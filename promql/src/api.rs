//! The Prometheus HTTP query API on gpuwatch's HTTP port: `/api/v1/query`, `/api/v1/query_range`,
//! `/api/v1/series`, `/api/v1/labels`, `/api/v1/label/<name>/values`, `/api/v1/metadata` and
//! `/api/v1/status/buildinfo`, GET or form-encoded POST, answering Prometheus's JSON and error
//! shapes (docs/promql.md).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use gpuwatch_query::QueryEngine;
use gpuwatch_query::executor::AbortOnDrop;
use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::{self, Expr};

use crate::error::{Error, ErrorType, Result, bad};
use crate::eval::{Evaluator, Grid, Settings, system_ms};
use crate::labels::{Labels, NAME};
use crate::params::{Params, parse_duration, parse_time};
use crate::{check, json, metadata, select};

/// Largest request body read (a long query in a form).
const MAX_BODY: usize = 1 << 20;

/// Most points a range query may have per series (Prometheus's limit).
const MAX_POINTS: i64 = 11_000;

/// Where the server's query engine is, once the store is open (empty until then: the handlers
/// answer `unavailable`).
pub type EngineSlot = Arc<OnceLock<QueryEngine>>;

/// What the handlers share.
#[derive(Clone)]
struct Api {
    engine: EngineSlot,
    settings: Settings,
}

/// The Prometheus API routes.
pub fn router(engine: EngineSlot, settings: Settings) -> Router {
    Router::new()
        .route("/api/v1/query", get(query).post(query))
        .route("/api/v1/query_range", get(query_range).post(query_range))
        .route("/api/v1/series", get(series).post(series))
        .route("/api/v1/labels", get(label_names).post(label_names))
        .route("/api/v1/label/{name}/values", get(label_values))
        .route("/api/v1/metadata", get(metadata_handler))
        .route("/api/v1/status/buildinfo", get(buildinfo))
        .with_state(Arc::new(Api { engine, settings }))
}

/// A Prometheus error answer.
pub fn error_response(e: &Error) -> Response {
    let t = e.error_type();
    if t == ErrorType::Internal {
        tracing::error!(error = %e, "promql query failed");
    }
    let body = format!(
        "{{\"status\":\"error\",\"errorType\":\"{}\",\"error\":{}}}",
        t.name(),
        json::string(&e.to_string())
    );
    let code = StatusCode::from_u16(t.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (code, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if t == ErrorType::Unavailable {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

fn ok_response(body: String) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn params(headers: &HeaderMap, query: Option<String>, body: &Bytes) -> Result<Params> {
    if body.len() > MAX_BODY {
        return Err(bad(format!(
            "request body larger than {MAX_BODY} bytes: send a shorter query"
        )));
    }
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/x-www-form-urlencoded"));
    Ok(Params::parse(
        query.as_deref(),
        form.then_some(body.as_ref()),
    ))
}

fn now_ms() -> i64 {
    system_ms(std::time::SystemTime::now())
}

/// The time limit of a request: its `timeout` parameter, at most the server's.
fn time_limit(engine: &QueryEngine, p: &Params) -> Result<Duration> {
    let server = engine.query_timeout();
    match p.get("timeout") {
        None => Ok(server),
        Some(t) => {
            let ms = parse_duration("timeout", t)?;
            if ms <= 0 {
                return Err(bad(
                    "invalid parameter \"timeout\": the timeout must be positive",
                ));
            }
            Ok(server.min(Duration::from_millis(ms as u64)))
        }
    }
}

/// Runs `work` on the query runtime within `limit`, in a query slot.
async fn run<F, Fut>(api: &Api, p: &Params, work: F) -> Response
where
    F: FnOnce(QueryEngine, Settings) -> Fut,
    Fut: Future<Output = Result<String>> + Send + 'static,
{
    let Some(engine) = api.engine.get() else {
        return error_response(&Error::Query(gpuwatch_query::Error::NotReady(
            gpuwatch_store::startup::reason(),
        )));
    };
    let limit = match time_limit(engine, p) {
        Ok(l) => l,
        Err(e) => return error_response(&e),
    };
    let slot = match engine.try_slot() {
        Ok(s) => s,
        Err(e) => return error_response(&Error::Query(e)),
    };
    let mut settings = api.settings.clone();
    settings.timeout = limit;
    let max_answer = engine.max_answer_bytes();
    let fut = work(engine.clone(), settings);
    let mut task = AbortOnDrop(engine.executor().spawn(fut));
    let answer = tokio::time::timeout(limit + Duration::from_millis(500), &mut task.0).await;
    drop(slot);
    match answer {
        Err(_) => error_response(&Error::Timeout("evaluation")),
        Ok(Err(e)) => error_response(&bad(format!("the query task failed: {e}"))),
        Ok(Ok(Err(e))) => error_response(&e),
        Ok(Ok(Ok(body))) => match max_answer {
            Some(max) if body.len() > max => error_response(&Error::AnswerTooLarge(max)),
            _ => ok_response(body),
        },
    }
}

/// Teaches the parser Prometheus 2.42's `holt_winters` (Prometheus 3 renamed it), once.
fn register_functions() {
    static DONE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        use parser::value::ValueType;
        let holt_winters = parser::Function::new(
            "holt_winters",
            vec![ValueType::Matrix, ValueType::Scalar, ValueType::Scalar],
            0,
            ValueType::Vector,
            false,
        );
        if let Err(e) = parser::register_extra_functions(vec![holt_winters]) {
            tracing::warn!(error = %e, "holt_winters() not registered with the PromQL parser");
        }
    });
}

/// Parses a PromQL expression, refusing what gpuwatch does not evaluate.
pub fn parse_query(q: &str) -> Result<Expr> {
    register_functions();
    let expr =
        parser::parse(q).map_err(|e| bad(format!("invalid parameter \"query\": {}", e.trim())))?;
    check::supported(&expr)?;
    Ok(expr)
}

fn required<'p>(p: &'p Params, name: &str) -> Result<&'p str> {
    p.get(name)
        .ok_or_else(|| bad(format!("invalid parameter \"{name}\": missing")))
}

/// True when the top of `e` orders its own result (`sort`, `sort_desc`, `topk`, `bottomk`).
fn keeps_order(e: &Expr) -> bool {
    match e {
        Expr::Paren(p) => keeps_order(&p.expr),
        Expr::Call(c) => matches!(c.func.name, "sort" | "sort_desc"),
        Expr::Aggregate(a) => {
            let op = a.op.id();
            op == parser::token::T_TOPK || op == parser::token::T_BOTTOMK
        }
        _ => false,
    }
}

async fn query(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Response {
    let p = match params(&headers, q, &body) {
        Ok(p) => p,
        Err(e) => return error_response(&e),
    };
    let prepared = (|| -> Result<(Expr, i64)> {
        let expr = parse_query(required(&p, "query")?)?;
        let t = match p.get("time") {
            Some(t) => parse_time("time", t)?,
            None => now_ms(),
        };
        Ok((expr, t))
    })();
    let (expr, t) = match prepared {
        Ok(x) => x,
        Err(e) => return error_response(&e),
    };
    run(&api, &p, move |engine, settings| async move {
        let ev = Evaluator::new(&engine, settings, t, t);
        let v = ev.eval_instant_top(&expr, t).await?;
        let data = json::instant(&v, t, keeps_order(&expr));
        Ok(json::success_warned(&data, &ev.warnings()))
    })
    .await
}

async fn query_range(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Response {
    let p = match params(&headers, q, &body) {
        Ok(p) => p,
        Err(e) => return error_response(&e),
    };
    let prepared = (|| -> Result<(Expr, Grid, i64)> {
        let start = parse_time("start", required(&p, "start")?)?;
        let end = parse_time("end", required(&p, "end")?)?;
        if end < start {
            return Err(bad(
                "invalid parameter \"end\": end timestamp must not be before start time",
            ));
        }
        let step = parse_duration("step", required(&p, "step")?)?;
        if step <= 0 {
            return Err(bad(
                "invalid parameter \"step\": zero or negative query resolution step widths are not accepted. Try a positive integer",
            ));
        }
        if (end - start) / step > MAX_POINTS {
            return Err(bad(
                "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution (?step=XX)",
            ));
        }
        let expr = parse_query(required(&p, "query")?)?;
        if matches!(
            expr.value_type(),
            parser::value::ValueType::Matrix | parser::value::ValueType::String
        ) {
            return Err(bad(format!(
                "invalid expression type \"{}\" for range query, must be Scalar or instant Vector",
                match expr.value_type() {
                    parser::value::ValueType::Matrix => "range vector",
                    _ => "string",
                }
            )));
        }
        Ok((expr, Grid::new(start, end, step), end))
    })();
    let (expr, g, end) = match prepared {
        Ok(x) => x,
        Err(e) => return error_response(&e),
    };
    run(&api, &p, move |engine, settings| async move {
        let ev = Evaluator::new(&engine, settings, g.start, end);
        let v = ev.eval(&expr, g).await?;
        crate::functions::check_range_result(&v)?;
        Ok(json::success_warned(&json::range(&v, g), &ev.warnings()))
    })
    .await
}

/// The `match[]` selectors of a request, each parsed into its matchers.
fn match_params(p: &Params, required_one: bool) -> Result<Vec<Vec<Matcher>>> {
    let raw = p.all("match[]");
    if raw.is_empty() && required_one {
        return Err(bad("no match[] parameter provided"));
    }
    let mut out = Vec::new();
    for m in raw {
        let expr = parser::parse(m)
            .map_err(|e| bad(format!("invalid parameter \"match[]\": {}", e.trim())))?;
        let Expr::VectorSelector(vs) = expr else {
            return Err(bad(format!(
                "invalid parameter \"match[]\": {m} is not a series selector"
            )));
        };
        let matchers = select::all_matchers(vs.name.as_deref(), &vs.matchers.matchers);
        select::check_selector(&matchers)?;
        out.push(matchers);
    }
    Ok(out)
}

/// The `start`/`end` of a metadata request (all of time by default).
fn span(p: &Params) -> Result<(i64, i64)> {
    let start = match p.get("start") {
        Some(s) => parse_time("start", s)?,
        None => 0,
    };
    let end = match p.get("end") {
        Some(s) => parse_time("end", s)?,
        None => now_ms() + 86_400_000,
    };
    Ok((start, end))
}

/// Every series the selectors (or, with none, every series) match in `[start, end]`, and the
/// warnings of their reads.
async fn matching_series(
    engine: &QueryEngine,
    settings: &Settings,
    sets: Vec<Vec<Matcher>>,
    start: i64,
    end: i64,
) -> Result<(Vec<Labels>, Vec<String>)> {
    let sets = if sets.is_empty() {
        vec![vec![Matcher::new(
            MatchOp::Re(regex::Regex::new("^(?:.+)$").map_err(|e| bad(e.to_string()))?),
            NAME,
            ".+",
        )]]
    } else {
        sets
    };
    let budget = select::Budget::new(settings.max_samples);
    let mut all = BTreeSet::new();
    for m in sets {
        for l in select::select_labels(engine, &m, start, end, &budget).await? {
            all.insert(l);
        }
    }
    Ok((all.into_iter().collect(), budget.warnings()))
}

async fn series(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Response {
    let p = match params(&headers, q, &body) {
        Ok(p) => p,
        Err(e) => return error_response(&e),
    };
    let prepared = match_params(&p, true).and_then(|m| Ok((m, span(&p)?)));
    let (sets, (start, end)) = match prepared {
        Ok(x) => x,
        Err(e) => return error_response(&e),
    };
    run(&api, &p, move |engine, settings| async move {
        let (found, warnings) = matching_series(&engine, &settings, sets, start, end).await?;
        let mut out = String::from("[");
        for (i, l) in found.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            json::labels(&mut out, l);
        }
        out.push(']');
        Ok(json::success_warned(&out, &warnings))
    })
    .await
}

fn string_list<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<String> = items.map(json::string).collect();
    format!("[{}]", v.join(","))
}

async fn label_names(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Response {
    let p = match params(&headers, q, &body) {
        Ok(p) => p,
        Err(e) => return error_response(&e),
    };
    let prepared = match_params(&p, false).and_then(|m| Ok((m, span(&p)?)));
    let (sets, (start, end)) = match prepared {
        Ok(x) => x,
        Err(e) => return error_response(&e),
    };
    run(&api, &p, move |engine, settings| async move {
        let (found, warnings) = matching_series(&engine, &settings, sets, start, end).await?;
        let names: BTreeSet<&str> = found
            .iter()
            .flat_map(|l| l.pairs().iter().map(|(k, _)| k.as_str()))
            .collect();
        Ok(json::success_warned(
            &string_list(names.into_iter()),
            &warnings,
        ))
    })
    .await
}

async fn label_values(
    State(api): State<Arc<Api>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Response {
    let p = match params(&headers, q, &Bytes::new()) {
        Ok(p) => p,
        Err(e) => return error_response(&e),
    };
    let valid = {
        let mut c = name.chars();
        matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
            && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
    };
    if !valid {
        return error_response(&bad(format!("invalid label name: {name:?}")));
    }
    let prepared = match_params(&p, false).and_then(|m| Ok((m, span(&p)?)));
    let (sets, (start, end)) = match prepared {
        Ok(x) => x,
        Err(e) => return error_response(&e),
    };
    run(&api, &p, move |engine, settings| async move {
        let (found, warnings) = matching_series(&engine, &settings, sets, start, end).await?;
        let values: BTreeSet<&str> = found
            .iter()
            .map(|l| l.get(&name))
            .filter(|v| !v.is_empty())
            .collect();
        Ok(json::success_warned(
            &string_list(values.into_iter()),
            &warnings,
        ))
    })
    .await
}

async fn metadata_handler(RawQuery(q): RawQuery) -> Response {
    let p = Params::parse(q.as_deref(), None);
    let limit = match p.get("limit").map(|l| l.parse::<i64>()) {
        None => None,
        Some(Ok(n)) if n >= 0 => Some(n as usize),
        Some(Ok(_)) => None,
        Some(Err(_)) => {
            return error_response(&bad("invalid parameter \"limit\": not a number"));
        }
    };
    ok_response(json::success(&metadata::render(p.get("metric"), limit)))
}

async fn buildinfo() -> Response {
    ok_response(json::success(&format!(
        "{{\"version\":\"2.42.0\",\"revision\":\"gpuwatch-{}\",\"branch\":\"\",\"buildUser\":\"\",\"buildDate\":\"\",\"goVersion\":\"\",\"application\":\"gpuwatch\"}}",
        env!("CARGO_PKG_VERSION")
    )))
}
