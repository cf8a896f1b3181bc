//! The server's own traces and metrics, exported over OTLP/HTTP with the OpenTelemetry SDK
//! (`--self-telemetry-endpoint URL`, off by default).
//!
//! Traces: the server's `tracing` spans go to the SDK through `tracing-opentelemetry`, one span
//! tree per request or background job (docs/self-telemetry.md lists the names): `ingest` →
//! `decode`, `wal_commit`, `buffer`; `query` → `plan`, `execute`, `encode`; `persist`;
//! `compaction`; `rule_evaluation`; `notification`. Spans are sent in batches to `URL/v1/traces`.
//!
//! Metrics: the samples of `/metrics` (store, queries, memory ceiling) are read by observable
//! instruments and sent every `--self-telemetry-interval` to `URL/v1/metrics`. With
//! `--self-telemetry-endpoint self` that is the server's own OTLP endpoint: its metrics land in
//! its `metrics` table (its traces have nowhere to go there and are dropped).
//!
//! The exporters' HTTP requests go through the server's own reqwest client on the server's
//! runtime, whichever thread the SDK exports from.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracer, SdkTracerProvider};
use tracing_subscriber::Registry;
use tracing_subscriber::reload;

use crate::error::{Error, Result};
use gpuwatch_common::metrics::{Kind, Sample};

use crate::server::Running;

/// Reads the server's own metrics.
pub(crate) type Sampler = Arc<dyn Fn() -> Vec<Sample> + Send + Sync>;

/// The OpenTelemetry layer of the log subscriber, set once the exporter is built.
pub(crate) type OtelLayer = Option<tracing_opentelemetry::OpenTelemetryLayer<Registry, SdkTracer>>;

/// Handle to swap the OpenTelemetry layer in.
pub(crate) type OtelHandle = reload::Handle<OtelLayer, Registry>;

/// The running exporters; flushed and shut down by [`SelfTelemetry::shutdown`].
#[derive(Debug)]
pub(crate) struct SelfTelemetry {
    tracer: SdkTracerProvider,
    meter: SdkMeterProvider,
}

/// HTTP for the exporters: the server's reqwest client, run on the server's runtime.
#[derive(Debug)]
struct Client {
    http: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let http = self.http.clone();
        let task = self.runtime.spawn(async move {
            let (parts, body) = request.into_parts();
            let url = parts.uri.to_string();
            let mut req = http.request(parts.method, url).body(body);
            for (name, value) in &parts.headers {
                req = req.header(name, value);
            }
            let resp = req.send().await?;
            let status = resp.status();
            let bytes = resp.bytes().await?;
            Ok::<_, reqwest::Error>((status, bytes))
        });
        let (status, bytes) = task.await??;
        let mut out = Response::new(bytes);
        *out.status_mut() = status;
        Ok(out)
    }
}

/// Where self-telemetry goes: `endpoint`, or the server's own HTTP listener for `self`.
pub(crate) fn base_url(endpoint: &str, running: &Running) -> String {
    if endpoint == "self" {
        return format!("http://{}", running.http_addr);
    }
    endpoint.trim_end_matches('/').to_string()
}

/// Starts the exporters to `base` and swaps the trace layer in through `handle`.
pub(crate) fn start(
    base: &str,
    interval: Duration,
    handle: &OtelHandle,
    sampler: Sampler,
) -> Result<SelfTelemetry> {
    let client = || Client {
        http: reqwest::Client::new(),
        runtime: tokio::runtime::Handle::current(),
    };
    let resource = Resource::builder()
        .with_service_name("gpuwatch")
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    let spans = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client())
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("{base}/v1/traces"))
        .with_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| Error::Config(format!("--self-telemetry-endpoint: {e}")))?;
    let tracer = SdkTracerProvider::builder()
        .with_span_processor(BatchSpanProcessor::builder(spans).build())
        .with_resource(resource.clone())
        .build();
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer.tracer("gpuwatch"))
        .with_tracked_inactivity(true);
    handle.reload(Some(layer)).map_err(Error::Telemetry)?;

    let metrics = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_http_client(client())
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("{base}/v1/metrics"))
        .with_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| Error::Config(format!("--self-telemetry-endpoint: {e}")))?;
    let meter = SdkMeterProvider::builder()
        .with_reader(
            PeriodicReader::builder(metrics)
                .with_interval(interval)
                .build(),
        )
        .with_resource(resource)
        .build();
    register_instruments(&meter, sampler);
    Ok(SelfTelemetry { tracer, meter })
}

/// One observable instrument per sample of `/metrics`, read when the reader collects.
fn register_instruments(meter: &SdkMeterProvider, sampler: Sampler) {
    let m = meter.meter("gpuwatch");
    for Sample {
        name, kind, help, ..
    } in sampler()
    {
        let r = Arc::clone(&sampler);
        let read = move || r().into_iter().find(|s| s.name == name).map(|s| s.value);
        if kind == Kind::Counter {
            let _ = m
                .f64_observable_counter(name)
                .with_description(help)
                .with_callback(move |o| {
                    if let Some(v) = read() {
                        o.observe(v, &[]);
                    }
                })
                .build();
        } else {
            let _ = m
                .f64_observable_gauge(name)
                .with_description(help)
                .with_callback(move |o| {
                    if let Some(v) = read() {
                        o.observe(v, &[]);
                    }
                })
                .build();
        }
    }
}

impl SelfTelemetry {
    /// Sends what is pending and stops the exporters.
    pub(crate) fn shutdown(self) {
        if let Err(e) = self.tracer.shutdown() {
            tracing::debug!(error = %e, "trace exporter shutdown");
        }
        if let Err(e) = self.meter.shutdown() {
            tracing::debug!(error = %e, "metric exporter shutdown");
        }
    }
}
