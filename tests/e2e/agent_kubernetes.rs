//! Kubernetes attribution end to end: a kubelet pod-resources server (the real
//! `v1.PodResourcesLister/List` gRPC method and messages, on a unix socket, served by tonic in
//! this test) hands GPUs to pods; the agent (`--source fake`, a simulated NVML) labels each
//! GPU's rows with its pod, through the real server into SQL, and drops the label once the pod
//! is gone from the kubelet's answer — without a restart. With `--pod-label`, the pods' labels
//! come from the kubelet's `/pods` (served by this test, behind a bearer token) into
//! `job_labels`.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuwatch_agent::attribute::kubernetes::proto::{
    ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse,
    PodResources,
};
use gpuwatch_agent::collect::fake::FakeNvml;
use gpuwatch_e2e::{TestAgent, TestServer};
use tonic::codegen::{BoxFuture, Context, Poll, Service, http};

use crate::{eventually, rows};

const HOST: &str = "k8s-e2e";

/// The kubelet's pod-resources service, answering `List` with whatever the test last set.
#[derive(Clone)]
struct FakeKubelet {
    answer: Arc<Mutex<ListPodResourcesResponse>>,
}

struct ListSvc(Arc<Mutex<ListPodResourcesResponse>>);

impl tonic::server::UnaryService<ListPodResourcesRequest> for ListSvc {
    type Response = ListPodResourcesResponse;
    type Future = BoxFuture<tonic::Response<Self::Response>, tonic::Status>;

    fn call(&mut self, _: tonic::Request<ListPodResourcesRequest>) -> Self::Future {
        let answer = self.0.lock().expect("answer lock").clone();
        Box::pin(async move { Ok(tonic::Response::new(answer)) })
    }
}

impl Service<http::Request<tonic::body::Body>> for FakeKubelet {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let answer = self.answer.clone();
        if req.uri().path() == "/v1.PodResourcesLister/List" {
            return Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
                Ok(grpc.unary(ListSvc(answer), req).await)
            });
        }
        Box::pin(async move { Ok(tonic::Status::unimplemented("not in this kubelet").into_http()) })
    }
}

impl tonic::server::NamedService for FakeKubelet {
    const NAME: &'static str = "v1.PodResourcesLister";
}

fn pod(ns: &str, name: &str, container: &str, resource: &str, ids: &[String]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers: vec![ContainerResources {
            name: container.into(),
            devices: vec![ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids.to_vec(),
                topology: None,
            }],
            cpu_ids: vec![2, 3],
        }],
    }
}

/// `(gpu_index, scheduler, job_id, k8s_namespace, k8s_pod, k8s_container)` of each GPU's
/// newest row.
async fn newest(server: &TestServer) -> Vec<[String; 6]> {
    let r = rows(
        server,
        &format!(
            "SELECT gpu_index, scheduler, job_id, k8s_namespace, k8s_pod, k8s_container \
             FROM gpu_metrics WHERE host = '{HOST}' \
             AND time = (SELECT max(time) FROM gpu_metrics WHERE host = '{HOST}') \
             ORDER BY gpu_index"
        ),
    )
    .await;
    let s = |v: &serde_json::Value| match v {
        serde_json::Value::Null => "-".to_string(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    r.iter()
        .map(|x| {
            [
                s(&x["gpu_index"]),
                s(&x["scheduler"]),
                s(&x["job_id"]),
                s(&x["k8s_namespace"]),
                s(&x["k8s_pod"]),
                s(&x["k8s_container"]),
            ]
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn gpus_carry_their_pods_and_lose_them_when_the_pod_goes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("data"))
        .start();
    let socket = dir.path().join("pod-resources").join("kubelet.sock");
    std::fs::create_dir_all(socket.parent().expect("parent")).expect("socket dir");
    std::fs::create_dir_all(dir.path().join("dev")).expect("dev dir");

    let answer = Arc::new(Mutex::new(ListPodResourcesResponse {
        pod_resources: vec![
            pod(
                "ml",
                "train-0",
                "trainer",
                "nvidia.com/gpu",
                &[FakeNvml::uuid(0)],
            ),
            // Not a GPU: ignored even though the id looks like one.
            pod("net", "sriov", "c", "intel.com/sriov", &[FakeNvml::uuid(1)]),
            pod(
                "web",
                "infer-7",
                "server",
                "nvidia.com/gpu",
                &[format!("{}::0", FakeNvml::uuid(2))],
            ),
            // Time-slicing: a second pod on GPU 2, as another replica of it.
            pod(
                "web",
                "infer-8",
                "server",
                "nvidia.com/gpu",
                &[format!("{}::1", FakeNvml::uuid(2))],
            ),
        ],
    }));
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind the kubelet socket");
    let kubelet = FakeKubelet {
        answer: answer.clone(),
    };
    let serving = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(kubelet)
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await
    });

    // The kubelet's /pods, for the pod labels: only with the right bearer token.
    let token_file = dir.path().join("kubelet.token");
    std::fs::write(&token_file, "kubelet-token-0123\n").expect("token");
    let pods_url = serve_pods().await;

    let agent = TestAgent::start(&[
        "--pod-label",
        "team,project",
        "--kubelet-url",
        &pods_url,
        "--kubelet-token-file",
        token_file.to_str().expect("utf-8"),
        "--source",
        "fake",
        "--synthetic-gpus",
        "3",
        "--fake-dev-dir",
        dir.path().join("dev").to_str().expect("utf-8"),
        "--job-mapping-dir",
        dir.path().join("jobs").to_str().expect("utf-8"),
        "--pod-resources-socket",
        socket.to_str().expect("utf-8"),
        "--host",
        HOST,
        "--interval",
        "1s",
        "--flush-interval",
        "0s",
        "--endpoint",
        &server.otlp_url(),
        "--metrics-addr",
        "off",
        "--log-level",
        "error",
    ]);

    let want_pods = vec![
        ["0", "kubernetes", "ml/train-0", "ml", "train-0", "trainer"].map(String::from),
        ["1", "-", "-", "-", "-", "-"].map(String::from),
        ["2", "kubernetes", "web/infer-7", "web", "infer-7", "server"].map(String::from),
    ];
    eventually(
        Duration::from_secs(30),
        "gpus labelled with pods",
        || async { newest(&server).await == want_pods },
    )
    .await;

    // The pods' labels named by --pod-label (not pod-template-hash), from /pods.
    let labels = || async {
        rows(
            &server,
            &format!(
                "SELECT gpu_index, job_labels FROM gpu_metrics WHERE host = '{HOST}' \
                 AND time = (SELECT max(time) FROM gpu_metrics WHERE host = '{HOST}') \
                 AND job_labels IS NOT NULL ORDER BY gpu_index"
            ),
        )
        .await
    };
    let want_labels = serde_json::json!([
        {"gpu_index": 0, "job_labels": "project=llm,team=vision"},
        {"gpu_index": 2, "job_labels": "team=web"}
    ]);
    eventually(
        Duration::from_secs(30),
        "pods' labels on their gpus",
        || async { serde_json::Value::Array(labels().await) == want_labels },
    )
    .await;

    // The time-sliced GPU: its row names infer-7 (the first pod) and both pods' shares; the
    // jobs view bills each pod half of it, and the two add up to the GPU.
    let shared = rows(
        &server,
        &format!(
            "SELECT job_shares FROM gpu_metrics WHERE host = '{HOST}' AND gpu_index = 2 \
             AND time = (SELECT max(time) FROM gpu_metrics WHERE host = '{HOST}')"
        ),
    )
    .await;
    assert_eq!(
        shared[0]["job_shares"], "web/infer-7=0.5,web/infer-8=0.5",
        "{shared:?}"
    );
    let split = || async {
        rows(
            &server,
            "SELECT job_id, k8s_namespace, share, gpu_seconds FROM jobs WHERE job_id LIKE 'web/%' ORDER BY job_id",
        )
        .await
    };
    let gpu_seconds = |r: &serde_json::Value| r["gpu_seconds"].as_f64().unwrap_or(-1.0);
    // Two samples at least, so that the pods have GPU time.
    eventually(
        Duration::from_secs(30),
        "both pods billed half of GPU 2",
        || async {
            let s = split().await;
            s.len() == 2
                && s.iter()
                    .all(|r| r["share"].as_f64() == Some(0.5) && gpu_seconds(r) > 0.0)
        },
    )
    .await;
    let split = split().await;
    for r in &split {
        assert_eq!(r["k8s_namespace"], "web", "{r}");
    }
    assert!(
        (gpu_seconds(&split[0]) - gpu_seconds(&split[1])).abs() < 1e-9,
        "{split:?}"
    );

    // train-0 ends: the kubelet stops listing it.
    answer.lock().expect("answer lock").pod_resources.remove(0);
    let want_after = vec![
        ["0", "-", "-", "-", "-", "-"].map(String::from),
        ["1", "-", "-", "-", "-", "-"].map(String::from),
        ["2", "kubernetes", "web/infer-7", "web", "infer-7", "server"].map(String::from),
    ];
    eventually(
        Duration::from_secs(30),
        "the ended pod's label gone",
        || async { newest(&server).await == want_after },
    )
    .await;
    // Earlier rows keep the pod they had.
    let r = rows(
        &server,
        &format!(
            "SELECT count(*) AS n FROM gpu_metrics WHERE host = '{HOST}' AND k8s_pod = 'train-0' \
             AND gpu_index = 0"
        ),
    )
    .await;
    assert!(r[0]["n"].as_f64().is_some_and(|n| n >= 1.0), "{r:?}");
    drop(agent);
    serving.abort();
}

/// The kubelet's `GET /pods` with the test pods' labels, answering only the bearer token
/// `kubelet-token-0123` (401 otherwise); returns its base URL.
async fn serve_pods() -> String {
    use axum::http::{HeaderMap, StatusCode};
    let app = axum::Router::new().route(
        "/pods",
        axum::routing::get(|headers: HeaderMap| async move {
            let authorized = headers.get("authorization").and_then(|v| v.to_str().ok())
                == Some("Bearer kubelet-token-0123");
            if !authorized {
                return (StatusCode::UNAUTHORIZED, String::new());
            }
            let body = serde_json::json!({"kind": "PodList", "apiVersion": "v1", "items": [
                {"metadata": {"namespace": "ml", "name": "train-0",
                    "labels": {"team": "vision", "project": "llm", "pod-template-hash": "5d4f"}}},
                {"metadata": {"namespace": "web", "name": "infer-7", "labels": {"team": "web"}}},
                {"metadata": {"namespace": "kube-system", "name": "coredns-1"}}
            ]});
            (StatusCode::OK, body.to_string())
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}
