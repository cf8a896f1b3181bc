//! Honest readiness: `/readyz` says the real reason (as the answers of refused writes do,
//! `WriteRefused` and `super::ingest`).
//!
//! - Not open yet: what the store is doing (opening the logs, replaying the WAL, segment n of
//!   m) or why it cannot open (a full disk, an unreachable object store) and when it retries;
//!   503.
//! - Open with damage: still ready (200) — one damaged table or file never takes the intact
//!   ones down — with one `degraded:` line per damaged table log or data file.
//!   `/readyz?table=<name>` answers 503 for a table whose log is damaged, so a check can watch
//!   one table.
//! - Persistence stopped (a copied data directory): 503.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use gpuwatch_query::Status;
use gpuwatch_store::schema::Table;

use super::App;
use super::sql::error_response;

pub(super) async fn readyz(
    State(app): State<App>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let Some(store) = app.store.get() else {
        return error_response(
            Status::Unavailable,
            &format!("not ready: {}", gpuwatch_store::startup::reason()),
        );
    };
    if let Some(why) = store.fenced() {
        return error_response(Status::Unavailable, &format!("not ready: {why}"));
    }
    if let Some(name) = params.get("table") {
        let Some(table) = Table::from_name(name) else {
            return error_response(
                Status::BadRequest,
                &format!("no table {name:?}: name one of the tables in docs/schema.md"),
            );
        };
        let health = store.log_health(table);
        if health.blocks() {
            return error_response(
                Status::Unavailable,
                &format!("not ready: {}", health.describe(table)),
            );
        }
        return (StatusCode::OK, format!("ready: table {name}\n")).into_response();
    }
    let mut body = String::from("ready\n");
    for table in Table::ALL {
        let health = store.log_health(table);
        if health.damaged() {
            body.push_str(&format!("degraded: {}\n", health.describe(table)));
        }
    }
    for f in store.damaged_files() {
        body.push_str(&format!(
            "degraded: table {}: {}; run `gpuwatch check`\n",
            f.table,
            f.warning()
        ));
    }
    (StatusCode::OK, body).into_response()
}
