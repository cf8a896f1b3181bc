//! Bearer tokens with scopes (`--auth-tokens FILE`).
//!
//! The file is TOML, one `[[tokens]]` table per token:
//!
//! ```toml
//! [[tokens]]
//! name = "dcgm-fleet"            # shown in logs, never the token itself
//! token = "0123456789abcdef0123" # at least 16 characters
//! scopes = ["ingest"]            # any of "ingest", "query", "admin"
//! ```
//!
//! `ingest` allows the write endpoints (OTLP/HTTP, OTLP/gRPC, remote write), `query` the SQL
//! endpoints, `admin` everything. `/healthz`, `/readyz` and `/metrics` stay open. A request
//! without a valid `Authorization: Bearer <token>` gets 401 (gRPC `UNAUTHENTICATED`); a valid
//! token without the scope gets 403 (gRPC `PERMISSION_DENIED`).

use std::path::Path;
use std::sync::Arc;

use crate::server::sql::error_response;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use gpuwatch_query::Status;
use serde::Deserialize;

use crate::error::{Error, Result};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Scope {
    /// Write endpoints.
    Ingest,
    /// SQL endpoints.
    Query,
    /// Everything.
    Admin,
}

impl Scope {
    fn name(self) -> &'static str {
        match self {
            Scope::Ingest => "ingest",
            Scope::Query => "query",
            Scope::Admin => "admin",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToken {
    name: String,
    token: String,
    scopes: Vec<Scope>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    #[serde(default)]
    tokens: Vec<FileToken>,
}

struct Token {
    name: String,
    secret: Vec<u8>,
    scopes: Vec<Scope>,
}

/// The configured tokens.
pub(crate) struct Tokens {
    tokens: Vec<Token>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.tokens.iter().map(|t| t.name.as_str()).collect();
        f.debug_struct("Tokens").field("names", &names).finish()
    }
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No token, or not a configured one (401).
    Unauthenticated(&'static str),
    /// A valid token without the scope (403).
    Forbidden(String),
}

/// Compares without an early exit, so the time does not tell how much of a token matched.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tokens {
    /// Parses a token file's text.
    pub(crate) fn parse(text: &str, origin: &str) -> Result<Self> {
        let file: TokenFile = toml::from_str(text).map_err(|e| {
            Error::Config(format!(
                "auth tokens file {origin}: {}",
                e.to_string().trim()
            ))
        })?;
        if file.tokens.is_empty() {
            return Err(Error::Config(format!(
                "auth tokens file {origin} has no [[tokens]]: add at least one, see docs/http-api.md"
            )));
        }
        let mut tokens: Vec<Token> = Vec::new();
        for t in file.tokens {
            if t.token.chars().count() < 16 || t.token.chars().any(char::is_whitespace) {
                return Err(Error::Config(format!(
                    "auth tokens file {origin}: token {:?} must be at least 16 characters without spaces (e.g. `openssl rand -hex 24`)",
                    t.name
                )));
            }
            if t.scopes.is_empty() {
                return Err(Error::Config(format!(
                    "auth tokens file {origin}: token {:?} has no scopes: give it \"ingest\", \"query\" or \"admin\"",
                    t.name
                )));
            }
            if tokens.iter().any(|x| same(&x.secret, t.token.as_bytes())) {
                return Err(Error::Config(format!(
                    "auth tokens file {origin}: token {:?} repeats another token's secret",
                    t.name
                )));
            }
            tokens.push(Token {
                name: t.name,
                secret: t.token.into_bytes(),
                scopes: t.scopes,
            });
        }
        Ok(Self { tokens })
    }

    /// Reads a token file.
    pub(crate) fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Config(format!(
                "cannot read auth tokens file {}: {e}",
                path.display()
            ))
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Checks an `Authorization` header value for `scope`; returns the token's name.
    pub(crate) fn check(&self, authorization: Option<&str>, scope: Scope) -> Result<&str, Denied> {
        let Some(value) = authorization else {
            return Err(Denied::Unauthenticated(
                "missing bearer token: send Authorization: Bearer <token>",
            ));
        };
        let presented = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .map(str::trim)
            .unwrap_or("");
        self.check_secret(presented, scope)
    }

    /// Checks a token's secret for `scope`; returns the token's name.
    pub(crate) fn check_secret(&self, presented: &str, scope: Scope) -> Result<&str, Denied> {
        let mut found: Option<&Token> = None;
        for t in &self.tokens {
            if same(&t.secret, presented.as_bytes()) {
                found = Some(t);
            }
        }
        let Some(token) = found else {
            return Err(Denied::Unauthenticated(
                "invalid bearer token: check the token, or ask for one in the server's --auth-tokens file",
            ));
        };
        if token.scopes.contains(&scope) || token.scopes.contains(&Scope::Admin) {
            Ok(&token.name)
        } else {
            Err(Denied::Forbidden(format!(
                "token {:?} lacks the {} scope for this endpoint",
                token.name,
                scope.name()
            )))
        }
    }
}

/// Postgres wire logins: the password is a token with the `query` scope (the user name is free).
impl super::pg::PasswordCheck for Tokens {
    fn check(&self, _user: &str, password: &str) -> Result<(), super::pg::Denied> {
        use super::pg::Denied as Pg;
        match self.check_secret(password, Scope::Query) {
            Ok(_) => Ok(()),
            Err(Denied::Unauthenticated(_)) => Err(Pg::InvalidPassword),
            Err(Denied::Forbidden(msg)) => Err(Pg::NotAllowed(msg)),
        }
    }
}

/// State of the HTTP middleware.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    /// The tokens; `None` when auth is off.
    pub tokens: Option<Arc<Tokens>>,
    /// The scope the guarded routes need.
    pub scope: Scope,
}

/// HTTP middleware: refuses requests without a token of the guard's scope.
pub(crate) async fn require(State(guard): State<Guard>, req: Request, next: Next) -> Response {
    let Some(tokens) = &guard.tokens else {
        return next.run(req).await;
    };
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match tokens.check(authorization, guard.scope) {
        Ok(_) => next.run(req).await,
        Err(Denied::Unauthenticated(msg)) => {
            let mut resp = error_response(Status::BadRequest, msg);
            *resp.status_mut() = StatusCode::UNAUTHORIZED;
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            resp
        }
        Err(Denied::Forbidden(msg)) => error_response(Status::Forbidden, &msg),
    }
}

/// gRPC interceptor: the same check on the `authorization` metadata, scope `ingest`.
pub(crate) fn grpc_interceptor(
    tokens: Option<Arc<Tokens>>,
) -> impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone {
    move |req: tonic::Request<()>| {
        let Some(tokens) = &tokens else {
            return Ok(req);
        };
        let authorization = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        match tokens.check(authorization, Scope::Ingest) {
            Ok(_) => Ok(req),
            Err(Denied::Unauthenticated(msg)) => Err(tonic::Status::unauthenticated(msg)),
            Err(Denied::Forbidden(msg)) => Err(tonic::Status::permission_denied(msg)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
[[tokens]]
name = "fleet"
token = "ingest-0123456789abcdef"
scopes = ["ingest"]

[[tokens]]
name = "grafana"
token = "query-0123456789abcdef"
scopes = ["query"]

[[tokens]]
name = "ops"
token = "admin-0123456789abcdef"
scopes = ["admin"]
"#;

    #[test]
    fn scopes_are_enforced() {
        let t = Tokens::parse(FILE, "test").expect("valid file");
        let bearer = |s: &str| format!("Bearer {s}");
        assert_eq!(
            t.check(Some(&bearer("ingest-0123456789abcdef")), Scope::Ingest),
            Ok("fleet")
        );
        assert!(matches!(
            t.check(Some(&bearer("ingest-0123456789abcdef")), Scope::Query),
            Err(Denied::Forbidden(_))
        ));
        assert_eq!(
            t.check(Some(&bearer("admin-0123456789abcdef")), Scope::Query),
            Ok("ops")
        );
        assert!(matches!(
            t.check(None, Scope::Query),
            Err(Denied::Unauthenticated(_))
        ));
        assert!(matches!(
            t.check(Some(&bearer("query-0123456789abcdeX")), Scope::Query),
            Err(Denied::Unauthenticated(_))
        ));
        assert!(matches!(
            t.check(Some("query-0123456789abcdef"), Scope::Query),
            Err(Denied::Unauthenticated(_)),
        ));
        assert!(
            !format!("{t:?}").contains("0123456789"),
            "debug hides secrets"
        );
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        for (text, want) in [
            ("", "no [[tokens]]"),
            (
                "[[tokens]]\nname='a'\ntoken='short'\nscopes=['query']",
                "at least 16",
            ),
            (
                "[[tokens]]\nname='a'\ntoken='0123456789abcdef'\nscopes=[]",
                "no scopes",
            ),
            (
                "[[tokens]]\nname='a'\ntoken='0123456789abcdef'\nscopes=['root']",
                "unknown variant",
            ),
            (
                "[[tokens]]\nname='a'\ntoken='0123456789abcdef'\nscopes=['query']\n[[tokens]]\nname='b'\ntoken='0123456789abcdef'\nscopes=['query']",
                "repeats",
            ),
        ] {
            let err = Tokens::parse(text, "f").expect_err(text).to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn grpc_interceptor_checks_the_metadata() {
        let t = Arc::new(Tokens::parse(FILE, "test").expect("valid"));
        let mut f = grpc_interceptor(Some(t));
        let with = |v: &str| {
            let mut r = tonic::Request::new(());
            r.metadata_mut()
                .insert("authorization", v.parse().expect("ascii"));
            r
        };
        assert!(f(with("Bearer ingest-0123456789abcdef")).is_ok());
        let e = f(with("Bearer query-0123456789abcdef")).expect_err("scope");
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        let e = f(tonic::Request::new(())).expect_err("missing");
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert!(grpc_interceptor(None)(tonic::Request::new(())).is_ok());
    }

    #[test]
    fn postgres_passwords_are_query_tokens() {
        use crate::server::pg::{Denied as Pg, PasswordCheck};
        let t = Tokens::parse(FILE, "test").expect("valid");
        assert_eq!(
            PasswordCheck::check(&t, "grafana", "query-0123456789abcdef"),
            Ok(())
        );
        assert_eq!(
            PasswordCheck::check(&t, "anyone", "admin-0123456789abcdef"),
            Ok(())
        );
        assert_eq!(
            PasswordCheck::check(&t, "grafana", "query-0123456789abcdeX"),
            Err(Pg::InvalidPassword)
        );
        assert_eq!(
            PasswordCheck::check(&t, "grafana", ""),
            Err(Pg::InvalidPassword)
        );
        assert!(matches!(
            PasswordCheck::check(&t, "fleet", "ingest-0123456789abcdef"),
            Err(Pg::NotAllowed(msg)) if msg.contains("query")
        ));
    }
}
