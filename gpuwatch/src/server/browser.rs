//! What a web page cannot make a browser do to the server (docs/http-api.md, "Browsers").
//!
//! Every HTTP request passes [`guard`] before its scope is checked:
//! - `Sec-Fetch-Site: cross-site` is refused (403): a page of another site sent it.
//! - An `Origin` must be this server's own: the request's `Host`, with a host name the server
//!   answers to (403 otherwise; `Origin: null` too).
//! - On the main listener the `Host` must be a name the server answers to (403 otherwise), so
//!   that a name rebound to a loopback address (DNS rebinding) reads nothing. A request with an
//!   `Authorization` header is not checked: a browser never adds a bearer token by itself, so a
//!   rebound page cannot send one, and clients with tokens reach the server under any name.
//!   Allowed:
//!   `localhost`, the loopback addresses, the address bound (any address literal when bound to
//!   all interfaces) and `--allowed-hosts` (`*` allows every name). Health, self metrics and
//!   ingest (`/healthz`, `/readyz`, `/metrics`, `/v1/metrics`, `/api/v1/write`) take any Host:
//!   agents and Prometheus reach them under service names, and a browser can send them nothing
//!   that passes the content-type and Origin checks.
//! - A request with a body to an endpoint that documents its content types must carry one of
//!   them (415 otherwise): a page can send `text/plain`, form and multipart bodies to any
//!   address without asking, but nothing else.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The host names and addresses the server answers to.
#[derive(Debug, Clone)]
pub(crate) struct AllowedHosts {
    /// `--allowed-hosts` holds `*`.
    any: bool,
    /// `--allowed-hosts`, lowercase.
    names: Vec<String>,
    /// The addresses bound.
    bound: Vec<IpAddr>,
}

impl AllowedHosts {
    pub(crate) fn new(allowed: &[String], bound: &[SocketAddr]) -> Self {
        Self {
            any: allowed.iter().any(|h| h.trim() == "*"),
            names: allowed
                .iter()
                .map(|h| h.trim().trim_end_matches('.').to_ascii_lowercase())
                .collect(),
            bound: bound.iter().map(SocketAddr::ip).collect(),
        }
    }

    /// Whether `host` (a `Host` header or an origin's authority, port allowed) is allowed.
    pub(crate) fn allows(&self, authority: &str) -> bool {
        let host = host_of(authority);
        if self.any || host == "localhost" {
            return true;
        }
        match host.parse::<IpAddr>() {
            Ok(ip) => {
                ip.is_loopback()
                    || self.bound.iter().any(|b| *b == ip || b.is_unspecified())
                    || self.names.iter().any(|n| n.parse::<IpAddr>() == Ok(ip))
            }
            Err(_) => self.names.iter().any(|n| *n == host),
        }
    }
}

/// The host of an authority, lowercase, without port, brackets or a trailing dot.
fn host_of(authority: &str) -> String {
    let a = authority.trim();
    let host = if let Some(rest) = a.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else if a.matches(':').count() > 1 {
        a
    } else {
        a.split(':').next().unwrap_or("")
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// The state of [`guard`].
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    pub hosts: Arc<AllowedHosts>,
    /// Check `Host` (the main listener); the OTLP/HTTP listener serves ingest only.
    pub check_host: bool,
}

/// Paths that take any `Host`.
const ANY_HOST: &[&str] = &[
    "/healthz",
    "/readyz",
    "/metrics",
    "/v1/metrics",
    "/api/v1/write",
];

/// The content types an endpoint takes in a body, when it documents them. OTLP and remote write
/// check theirs in their handlers, with the 400 the interface gives them (remote write also
/// takes a body without one, as some senders send).
fn content_types(path: &str) -> Option<&'static [&'static str]> {
    const JSON: &[&str] = &["application/json"];
    const FORM: &[&str] = &["application/x-www-form-urlencoded"];
    match path {
        "/api/v1/sql" | "/api/v1/silences" => Some(JSON),
        "/api/v1/query" | "/api/v1/query_range" | "/api/v1/series" | "/api/v1/labels" => Some(FORM),
        _ => None,
    }
}

/// The middleware.
pub(crate) async fn guard(State(g): State<Guard>, req: Request, next: Next) -> Response {
    let mut headers = req.headers().clone();
    if !headers.contains_key(header::HOST)
        && let Some(a) = req
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    {
        headers.insert(header::HOST, a);
    }
    if let Err(refusal) = check(&g, req.method(), req.uri().path(), &headers) {
        return refusal;
    }
    next.run(req).await
}

fn header_str<'a>(headers: &'a HeaderMap, name: header::HeaderName) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn check(g: &Guard, method: &Method, path: &str, headers: &HeaderMap) -> Result<(), Response> {
    if header_str(headers, header::HeaderName::from_static("sec-fetch-site"))
        .is_some_and(|s| s.eq_ignore_ascii_case("cross-site"))
    {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "cross-site request refused: this server answers its own pages and non-browser clients only",
        ));
    }
    let host = header_str(headers, header::HOST).unwrap_or("");
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("null");
        let authority = origin
            .split_once("://")
            .map(|(_, a)| a.trim_end_matches('/'))
            .unwrap_or("");
        let same = !authority.is_empty() && authority.eq_ignore_ascii_case(host);
        if same && !g.hosts.allows(authority) {
            return Err(unknown_host(host));
        }
        if !same {
            return Err(refuse(
                StatusCode::FORBIDDEN,
                &format!(
                    "cross-origin request refused (Origin {origin:?}, Host {host:?}): use the console served by this server, or a client that sends no Origin"
                ),
            ));
        }
    }
    let bearer = headers.contains_key(header::AUTHORIZATION);
    if g.check_host && !bearer && !ANY_HOST.contains(&path) && !g.hosts.allows(host) {
        return Err(unknown_host(host));
    }
    let has_body = !matches!(*method, Method::GET | Method::HEAD | Method::DELETE);
    if let (true, Some(allowed)) = (has_body, content_types(path)) {
        let sent = header_str(headers, header::CONTENT_TYPE).unwrap_or("");
        let essence = sent.split(';').next().unwrap_or("").trim();
        if !allowed.iter().any(|a| essence.eq_ignore_ascii_case(a)) {
            return Err(refuse(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &format!(
                    "content type {sent:?} is not accepted by {path}: send {}",
                    allowed.join(" or ")
                ),
            ));
        }
    }
    Ok(())
}

fn unknown_host(host: &str) -> Response {
    refuse(
        StatusCode::FORBIDDEN,
        &format!(
            "host {:?} is not a name of this server: add it to --allowed-hosts (docs/http-api.md)",
            host_of(host)
        ),
    )
}

fn refuse(status: StatusCode, message: &str) -> Response {
    tracing::debug!(status = status.as_u16(), "{message}");
    let body = serde_json::json!({ "error": message }).to_string();
    let mut resp = (status, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(allowed: &[&str], bound: &str) -> AllowedHosts {
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        AllowedHosts::new(&allowed, &[bound.parse().expect("addr")])
    }

    #[test]
    fn hosts_allowed_by_default_and_by_the_list() {
        let h = hosts(&["gpuwatch.example"], "10.0.0.5:9500");
        for ok in [
            "localhost:9500",
            "127.0.0.1:9500",
            "127.8.0.1",
            "[::1]:9500",
            "10.0.0.5:9500",
            "GPUWATCH.example:9500",
            "gpuwatch.example.",
        ] {
            assert!(h.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example:9500",
            "10.0.0.6:9500",
            "",
            "gpuwatch.example.evil",
        ] {
            assert!(!h.allows(bad), "{bad}");
        }
        let all = hosts(&[], "0.0.0.0:9500");
        assert!(all.allows("192.168.1.4:9500"));
        assert!(!all.allows("rebound.example"));
        assert!(hosts(&["*"], "127.0.0.1:1").allows("anything.example"));
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("header"));
        }
        h
    }

    /// The status a request is refused with by the guard of a server on 127.0.0.1:9500 that
    /// checks Host, or `None` when it passes.
    fn status(m: Method, path: &str, h: &[(&'static str, &str)]) -> Option<u16> {
        let g = Guard {
            hosts: Arc::new(hosts(&[], "127.0.0.1:9500")),
            check_host: true,
        };
        check(&g, &m, path, &headers(h))
            .err()
            .map(|r| r.status().as_u16())
    }

    const HOST: (&str, &str) = ("host", "127.0.0.1:9500");
    const JSON: (&str, &str) = ("content-type", "application/json");
    const FORM: (&str, &str) = ("content-type", "application/x-www-form-urlencoded");

    #[test]
    fn the_console_and_scripts_pass_and_form_posts_are_refused() {
        // The console: same origin, JSON.
        assert_eq!(
            status(
                Method::POST,
                "/api/v1/sql",
                &[
                    HOST,
                    JSON,
                    ("origin", "http://127.0.0.1:9500"),
                    ("sec-fetch-site", "same-origin")
                ]
            ),
            None
        );
        // Scripts and Grafana: no Origin.
        assert_eq!(status(Method::POST, "/api/v1/sql", &[HOST, JSON]), None);
        assert_eq!(status(Method::POST, "/api/v1/query", &[HOST, FORM]), None);
        // What a page may post without asking: refused where the endpoint wants JSON.
        assert_eq!(
            status(
                Method::POST,
                "/api/v1/silences",
                &[HOST, ("content-type", "text/plain")]
            ),
            Some(415)
        );
        assert_eq!(
            status(Method::POST, "/api/v1/sql", &[HOST, FORM]),
            Some(415)
        );
    }

    #[test]
    fn cross_origin_browser_requests_are_refused() {
        assert_eq!(
            status(
                Method::POST,
                "/api/v1/sql",
                &[HOST, JSON, ("origin", "http://evil.example")]
            ),
            Some(403)
        );
        assert_eq!(
            status(
                Method::POST,
                "/api/v1/sql",
                &[HOST, JSON, ("origin", "null")]
            ),
            Some(403)
        );
        assert_eq!(
            status(
                Method::DELETE,
                "/api/v1/silences/x",
                &[HOST, ("sec-fetch-site", "cross-site")]
            ),
            Some(403)
        );
    }

    #[test]
    fn rebound_names_are_refused_unless_a_token_or_ingest() {
        // DNS rebinding: the page's origin and Host agree, but the name is not the server's.
        let rebound = [
            ("host", "rebound.example:9500"),
            JSON,
            ("origin", "http://rebound.example:9500"),
        ];
        assert_eq!(status(Method::POST, "/api/v1/sql", &rebound), Some(403));
        assert_eq!(
            status(
                Method::GET,
                "/api/v1/jobs",
                &[("host", "rebound.example:9500")]
            ),
            Some(403)
        );
        // A client with a token may use any name (its scope is checked next).
        let token = ("authorization", "Bearer t");
        let named = [("host", "head-node:9500"), token];
        assert_eq!(status(Method::GET, "/api/v1/jobs", &named), None);
        // Health and ingest take any Host.
        assert_eq!(
            status(Method::GET, "/healthz", &[("host", "gpuwatch.svc")]),
            None
        );
        assert_eq!(
            status(Method::POST, "/v1/metrics", &[("host", "head-node:4318")]),
            None
        );
    }
}
