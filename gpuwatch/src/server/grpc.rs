//! OTLP/gRPC on `--otlp-grpc-addr`: the `opentelemetry.proto.collector.metrics.v1.MetricsService`
//! `Export` call, decoded by the same code as OTLP/HTTP and stored through the one write path
//! ([`super::ingest::write`]; durable before the answer). Partial success is answered in `partial_success`; errors map to gRPC codes:
//! `INVALID_ARGUMENT` for malformed data, `RESOURCE_EXHAUSTED` above `--max-body-bytes` (tonic
//! says `OUT_OF_RANGE`, which OTLP exporters retry; [`OversizeIsExhausted`] answers the status
//! the OTLP specification gives, which they drop),
//! `UNAVAILABLE` while the WAL replays or when the write could not be stored (retryable).
//! The message is inflated before tonic decodes it, with room reserved under `--memory-limit`
//! as it is inflated ([`inflate`]; refused with `UNAVAILABLE`, or `RESOURCE_EXHAUSTED` when it
//! could never fit).
//! With `--auth-tokens`, the `authorization: Bearer <token>` metadata needs the `ingest` scope.

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::codec::CompressionEncoding;

use std::sync::Arc;

use tonic::service::interceptor::InterceptedService;

use super::App;
use super::auth::{Tokens, grpc_interceptor};
use super::conn::raw::{Held, RawConns};
use super::ingest::{self, Protocol, WriteBudget};

mod inflate;

use inflate::{InflateFirst, Reserved};

/// The service.
#[derive(Debug, Clone)]
pub(super) struct Otlp {
    app: App,
}

#[tonic::async_trait]
impl MetricsService for Otlp {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        // The room [`InflateFirst`] reserved before the message was inflated and decoded; it
        // covers the rows built from it too.
        let reserved = request
            .extensions()
            .get::<Reserved>()
            .and_then(Reserved::take);
        let req = request.into_inner();
        let (budget, reserve_now) = match reserved {
            Some(b) => (b, false),
            None => (WriteBudget::new(&self.app), true),
        };
        let stats = ingest::write_within(
            &self.app,
            Protocol::OtlpGrpc,
            async { Ok(req) },
            move |req, now, budget| {
                if reserve_now {
                    gpuwatch_store::ingest::DecodeBudget::inflated(
                        budget,
                        prost::Message::encoded_len(&req),
                    )?;
                }
                gpuwatch_store::ingest::otlp::to_write_batch(&req, now)
            },
            budget,
        )
        .await
        .map_err(|e| e.grpc_status())?;
        let partial_success = stats.partial_success_message().map(|message| {
            tracing::warn!("otlp/grpc export partly rejected: {message}");
            ExportMetricsPartialSuccess {
                rejected_data_points: i64::try_from(stats.rejected).unwrap_or(i64::MAX),
                error_message: message,
            }
        });
        Ok(tonic::Response::new(ExportMetricsServiceResponse {
            partial_success,
        }))
    }
}

/// Plain connections of `listener`, each holding its place among `conns`.
fn plain(
    listener: TcpListener,
    conns: Arc<RawConns>,
) -> impl futures::Stream<Item = std::io::Result<Held<tokio::net::TcpStream>>> {
    futures::stream::unfold((listener, conns), |(listener, conns)| async move {
        let accepted = listener.accept().await.map(|(io, _)| {
            let _ = io.set_nodelay(true);
            let slot = conns.admit(&io);
            Held::new(io, slot)
        });
        if let Err(e) = &accepted {
            tracing::warn!(error = %e, "otlp/grpc listener: accept failed");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Some((accepted, (listener, conns)))
    })
}

/// Serves OTLP/gRPC on `listener` until `rx` changes, its connections bounded by `conns`.
pub(super) fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: App,
    tokens: Option<Arc<Tokens>>,
    conns: Arc<RawConns>,
    mut rx: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let max = app.max_body_bytes;
    let service = MetricsServiceServer::new(Otlp { app: app.clone() })
        .max_decoding_message_size(max)
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip);
    // Authentication first, then the message inflated within the ceiling, then tonic.
    let service = OversizeIsExhausted(InterceptedService::new(
        InflateFirst::new(service, app),
        grpc_interceptor(tokens),
    ));
    tokio::spawn(async move {
        let shutdown = async move {
            let _ = rx.changed().await;
        };
        let server = tonic::transport::Server::builder().add_service(service);
        let result = match tls {
            None => {
                server
                    .serve_with_incoming_shutdown(plain(listener, conns), shutdown)
                    .await
            }
            Some(acceptor) => {
                let incoming = match super::tls::TlsIncoming::new(listener, acceptor, "otlp-grpc") {
                    Ok(i) => i,
                    Err(e) => {
                        tracing::error!(error = %e, "otlp/grpc listener failed");
                        return;
                    }
                };
                let stream = futures::stream::unfold(
                    (incoming, conns),
                    |(mut incoming, conns)| async move {
                        let (conn, _) = incoming.next().await?;
                        let slot = conns.admit(conn.get_ref().0);
                        let io = super::tls::GrpcTlsStream(conn);
                        Some((
                            Ok::<_, std::io::Error>(Held::new(io, slot)),
                            (incoming, conns),
                        ))
                    },
                );
                server.serve_with_incoming_shutdown(stream, shutdown).await
            }
        };
        if let Err(e) = result {
            tracing::error!(error = %e, "otlp/grpc listener failed");
        }
    })
}

/// Answers `RESOURCE_EXHAUSTED` where tonic refuses a message above `--max-body-bytes` with
/// `OUT_OF_RANGE`. The export handler itself never answers `OUT_OF_RANGE`, so every such answer
/// is tonic's size check.
#[derive(Debug, Clone)]
pub(super) struct OversizeIsExhausted<S>(pub S);

impl<S: tonic::server::NamedService> tonic::server::NamedService for OversizeIsExhausted<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> tonic::codegen::Service<tonic::codegen::http::Request<B>> for OversizeIsExhausted<S>
where
    S: tonic::codegen::Service<
            tonic::codegen::http::Request<B>,
            Response = tonic::codegen::http::Response<R>,
        >,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = tonic::codegen::BoxFuture<S::Response, S::Error>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: tonic::codegen::http::Request<B>) -> Self::Future {
        let answer = self.0.call(req);
        Box::pin(async move {
            let mut resp = answer.await?;
            let out_of_range = (tonic::Code::OutOfRange as i32).to_string();
            if resp
                .headers()
                .get("grpc-status")
                .is_some_and(|v| v.as_bytes() == out_of_range.as_bytes())
            {
                let exhausted = (tonic::Code::ResourceExhausted as i32).to_string();
                if let Ok(v) = tonic::codegen::http::HeaderValue::from_str(&exhausted) {
                    resp.headers_mut().insert("grpc-status", v);
                }
            }
            Ok(resp)
        })
    }
}
