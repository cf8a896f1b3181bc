//! The HTTP routes of the main listener and of the OTLP/HTTP listener, each behind the scope
//! its bearer token needs (docs/http-api.md).

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};

use super::{App, auth, browser, metrics, not_found, otlp_http, readiness, remote_write, sql};
use crate::config::ServeConfig;

/// The main listener's router, and the ingest router the OTLP/HTTP listener serves too.
pub(super) fn routers(config: &ServeConfig, app: &App) -> (Router, Router) {
    let guard = |scope| {
        axum::middleware::from_fn_with_state(
            auth::Guard {
                tokens: config.auth_tokens.clone(),
                scope,
            },
            auth::require,
        )
    };
    let ingest = Router::new()
        .route("/v1/metrics", post(otlp_http::handle))
        .route_layer(guard(auth::Scope::Ingest))
        .with_state(app.clone());
    let prometheus = Router::new()
        .route("/api/v1/write", post(remote_write::handle))
        .route_layer(guard(auth::Scope::Ingest))
        .with_state(app.clone());
    let metrics = Router::new()
        .route("/metrics", get(metrics::self_metrics))
        .with_state(Arc::new(app.metrics.registry(app)));
    let main = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readiness::readyz))
        .with_state(app.clone())
        .merge(metrics)
        .merge(ingest.clone())
        .merge(prometheus)
        .merge(
            sql::router(Arc::clone(&app.engine), app.metrics.query_seconds.clone())
                .route_layer(guard(auth::Scope::Query)),
        )
        // The Prometheus HTTP query API (PromQL over the same tables), with SQL's scope.
        .merge(
            gpuwatch_promql::router(Arc::clone(&app.engine), config.promql.clone())
                .route_layer(guard(auth::Scope::Query)),
        )
        .merge(
            crate::jobs::router(
                Arc::clone(&app.engine),
                config.alerts.cost.clone(),
                config.alerts.jobs.clone(),
            )
            .route_layer(guard(auth::Scope::Query)),
        )
        .merge(
            crate::alerts_wiring::router(Arc::clone(&app.alerting))
                .route_layer(guard(auth::Scope::Admin)),
        )
        // The web console's static files (no data: every figure it shows comes from the APIs
        // above, with the caller's token).
        .merge(gpuwatch_console::router())
        .fallback(not_found);
    let browser = |check_host| {
        let l = &config.settings.listeners;
        axum::middleware::from_fn_with_state(
            browser::Guard {
                hosts: Arc::new(browser::AllowedHosts::new(
                    &l.allowed_hosts,
                    &[l.http_addr, l.otlp_http_addr],
                )),
                check_host,
            },
            browser::guard,
        )
    };
    (main.layer(browser(true)), ingest.layer(browser(false)))
}
