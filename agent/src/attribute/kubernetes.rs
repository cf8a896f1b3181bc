//! Kubernetes attribution: which pod holds each GPU, from the kubelet's pod-resources API.
//!
//! The kubelet serves `v1.PodResourcesLister` (k8s.io/kubelet/pkg/apis/podresources/v1) on a
//! unix socket, by default `/var/lib/kubelet/pod-resources/kubelet.sock` (a DaemonSet mounts
//! that directory with a `hostPath`). Its `List` call answers, for every pod on the node, the
//! devices each container was given by device plugins. The NVIDIA device plugin names GPUs by
//! UUID under the resource `nvidia.com/gpu`, MIG devices by MIG UUID under `nvidia.com/gpu`
//! (MIG strategy `single`) or `nvidia.com/mig-<profile>` (strategy `mixed`); with time-slicing
//! a GPU is shared as `<uuid>::<replica>`, and the replica suffix is dropped here.
//!
//! [`PodResources`] polls `List` at every collection (a cheap local call) while the socket
//! exists, so a pod starting or ending shows at the next tick without a restart. When the
//! socket is absent the attribution is simply not used; when a call fails the last answer is
//! kept for [`STALE_AFTER_FAILURES`] more ticks, then dropped.
//!
//! A GPU held by a pod is labelled `job.scheduler = kubernetes`, `job.id = <namespace>/<pod>`
//! (so that `jobs` and the idle-GPU rules, which need a job id, see pods too), and
//! `k8s.namespace.name`, `k8s.pod.name`, `k8s.container.name`. When several pods share a GPU
//! (time-slicing), the first in (namespace, pod, container) order labels the GPU row. A GPU
//! process whose `/proc/<pid>/cgroup` names a pod ([`super::proc::pod_uid_from_cgroup`]) takes
//! the pod of its GPU: the pod-resources API does not give pod UIDs, so the UID only says the
//! process runs in Kubernetes.
//!
//! The proto messages below are written by hand with the field numbers of the kubelet's
//! `api.proto`; fields the agent does not read (topology, memory, dynamic resources) are left
//! out and skipped by the decoder, as protobuf allows.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::{debug, info, warn};

use crate::collect::{JobLabels, PodLabels};

/// Default `--pod-resources-socket`.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// Scheduler name of Kubernetes pods.
pub const KUBERNETES: &str = "kubernetes";
/// Failed polls after which the last answer is dropped.
pub const STALE_AFTER_FAILURES: u32 = 3;
/// Time one `List` call may take.
pub const LIST_TIMEOUT: Duration = Duration::from_secs(2);
/// The gRPC method path of `List`.
pub const LIST_PATH: &str = "/v1.PodResourcesLister/List";

/// The messages of `k8s.io/kubelet/pkg/apis/podresources/v1/api.proto` the agent uses.
pub mod proto {
    /// `ListPodResourcesRequest` (empty).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodResourcesRequest {}

    /// `ListPodResourcesResponse`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodResourcesResponse {
        /// `repeated PodResources pod_resources = 1`.
        #[prost(message, repeated, tag = "1")]
        pub pod_resources: Vec<PodResources>,
    }

    /// `PodResources`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodResources {
        /// `string name = 1`.
        #[prost(string, tag = "1")]
        pub name: String,
        /// `string namespace = 2`.
        #[prost(string, tag = "2")]
        pub namespace: String,
        /// `repeated ContainerResources containers = 3`.
        #[prost(message, repeated, tag = "3")]
        pub containers: Vec<ContainerResources>,
    }

    /// `ContainerResources`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerResources {
        /// `string name = 1`.
        #[prost(string, tag = "1")]
        pub name: String,
        /// `repeated ContainerDevices devices = 2`.
        #[prost(message, repeated, tag = "2")]
        pub devices: Vec<ContainerDevices>,
        /// `repeated int64 cpu_ids = 3`.
        #[prost(int64, repeated, tag = "3")]
        pub cpu_ids: Vec<i64>,
    }

    /// `ContainerDevices`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerDevices {
        /// `string resource_name = 1`.
        #[prost(string, tag = "1")]
        pub resource_name: String,
        /// `repeated string device_ids = 2`.
        #[prost(string, repeated, tag = "2")]
        pub device_ids: Vec<String>,
        /// `TopologyInfo topology = 3`.
        #[prost(message, optional, tag = "3")]
        pub topology: Option<TopologyInfo>,
    }

    /// `TopologyInfo`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TopologyInfo {
        /// `repeated NUMANode nodes = 1`.
        #[prost(message, repeated, tag = "1")]
        pub nodes: Vec<NumaNode>,
    }

    /// `NUMANode`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NumaNode {
        /// `int64 ID = 1`.
        #[prost(int64, tag = "1")]
        pub id: i64,
    }
}

/// Whether a device plugin resource names NVIDIA GPUs or MIG devices.
pub fn is_gpu_resource(name: &str) -> bool {
    name == "nvidia.com/gpu" || name.starts_with("nvidia.com/mig-")
}

/// Device id → the pods holding it, sorted.
pub type DeviceMap = BTreeMap<String, Vec<PodLabels>>;

/// The GPU devices of a `List` answer. Time-slicing replicas (`<uuid>::<n>`) count as their
/// GPU.
pub fn device_map(resp: &proto::ListPodResourcesResponse) -> DeviceMap {
    let mut map = DeviceMap::new();
    for pod in &resp.pod_resources {
        for c in &pod.containers {
            for d in c
                .devices
                .iter()
                .filter(|d| is_gpu_resource(&d.resource_name))
            {
                for id in &d.device_ids {
                    let id = id.split("::").next().unwrap_or(id).trim();
                    if id.is_empty() {
                        continue;
                    }
                    let labels = PodLabels {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: c.name.clone(),
                    };
                    let list = map.entry(id.to_string()).or_default();
                    if !list.contains(&labels) {
                        list.push(labels);
                        list.sort();
                    }
                }
            }
        }
    }
    map
}

/// The job labels of a pod.
pub fn job_of(pod: &PodLabels) -> JobLabels {
    JobLabels {
        id: format!("{}/{}", pod.namespace, pod.pod),
        user: String::new(),
        name: String::new(),
        scheduler: KUBERNETES.to_string(),
        k8s: Some(pod.clone()),
        extra: Default::default(),
    }
}

/// Errors of one `List` call, as text for the log.
async fn list(socket: &Path) -> Result<proto::ListPodResourcesResponse, String> {
    // The URI's host is a placeholder: tonic connects to the socket path of a `unix:` URI.
    let uri = format!("unix://{}", socket.display());
    let endpoint = tonic::transport::Endpoint::from_shared(uri)
        .map_err(|e| format!("bad socket path: {e}"))?
        .connect_timeout(LIST_TIMEOUT)
        .timeout(LIST_TIMEOUT);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot connect: {}", chain(&e)))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| format!("not ready: {}", chain(&e)))?;
    let codec = tonic_prost::ProstCodec::<
        proto::ListPodResourcesRequest,
        proto::ListPodResourcesResponse,
    >::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(LIST_PATH);
    grpc.unary(
        tonic::Request::new(proto::ListPodResourcesRequest {}),
        path,
        codec,
    )
    .await
    .map(tonic::Response::into_inner)
    .map_err(|s| format!("List failed: {:?}: {}", s.code(), s.message()))
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        // tonic repeats its cause in its own text: keep each part once.
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Polls the kubelet and keeps the last device map.
#[derive(Debug)]
pub struct PodResources {
    socket: PathBuf,
    map: DeviceMap,
    failures: u32,
    present: bool,
    warned: bool,
}

impl PodResources {
    /// Polls the pod-resources socket at `socket`.
    pub fn new(socket: &Path) -> Self {
        PodResources {
            socket: socket.to_path_buf(),
            map: DeviceMap::new(),
            failures: 0,
            present: false,
            warned: false,
        }
    }

    /// The devices of the last good answer.
    pub fn devices(&self) -> &DeviceMap {
        &self.map
    }

    /// Ask the kubelet again (when its socket exists).
    pub async fn refresh(&mut self) {
        if !self.socket.exists() {
            if self.present {
                info!(socket = %self.socket.display(), "kubelet pod-resources socket gone: no kubernetes attribution");
            }
            self.present = false;
            self.map.clear();
            return;
        }
        if !self.present {
            info!(socket = %self.socket.display(), "kubelet pod-resources socket found: gpus are labelled with their pods");
            self.present = true;
        }
        match tokio::time::timeout(LIST_TIMEOUT * 2, list(&self.socket)).await {
            Ok(Ok(resp)) => {
                self.map = device_map(&resp);
                self.failures = 0;
                self.warned = false;
                debug!(devices = self.map.len(), "pod resources listed");
            }
            outcome => {
                let reason = match outcome {
                    Ok(Err(e)) => e,
                    _ => "timed out".to_string(),
                };
                self.failures += 1;
                if self.warned {
                    debug!(socket = %self.socket.display(), error = %reason, "kubelet pod-resources call failed");
                } else {
                    warn!(socket = %self.socket.display(), error = %reason, "kubelet pod-resources call failed; check that the agent may read the socket (root, hostPath mount)");
                    self.warned = true;
                }
                if self.failures > STALE_AFTER_FAILURES {
                    self.map.clear();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::proto::{
        ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources as Pod,
    };
    use super::*;

    fn pod(ns: &str, name: &str, containers: Vec<ContainerResources>) -> Pod {
        Pod {
            name: name.into(),
            namespace: ns.into(),
            containers,
        }
    }

    fn container(name: &str, resource: &str, ids: &[&str]) -> ContainerResources {
        ContainerResources {
            name: name.into(),
            devices: vec![ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids.iter().map(|s| s.to_string()).collect(),
                topology: None,
            }],
            cpu_ids: vec![],
        }
    }

    #[test]
    fn gpu_devices_map_to_their_pods() {
        let resp = ListPodResourcesResponse {
            pod_resources: vec![
                pod(
                    "ml",
                    "train-0",
                    vec![container("trainer", "nvidia.com/gpu", &["GPU-a", "GPU-b"])],
                ),
                pod(
                    "ml",
                    "nic",
                    vec![container("c", "example.com/nic", &["GPU-c"])],
                ),
                pod(
                    "web",
                    "infer",
                    vec![container("server", "nvidia.com/mig-1g.10gb", &["MIG-1"])],
                ),
                pod(
                    "x",
                    "shared-b",
                    vec![container("c", "nvidia.com/gpu", &["GPU-s::1"])],
                ),
                pod(
                    "x",
                    "shared-a",
                    vec![container("c", "nvidia.com/gpu", &["GPU-s::0"])],
                ),
            ],
        };
        let map = device_map(&resp);
        assert_eq!(map["GPU-a"][0].pod, "train-0");
        assert_eq!(map["GPU-b"][0].container, "trainer");
        assert!(!map.contains_key("GPU-c"), "not a gpu resource");
        assert_eq!(map["MIG-1"][0].namespace, "web");
        let shared: Vec<&str> = map["GPU-s"].iter().map(|p| p.pod.as_str()).collect();
        assert_eq!(shared, vec!["shared-a", "shared-b"]);
        let job = job_of(&map["GPU-a"][0]);
        assert_eq!(job.id, "ml/train-0");
        assert_eq!(job.scheduler, "kubernetes");
    }

    #[test]
    fn messages_use_the_kubelet_field_numbers() {
        use prost::Message;
        // Bytes as the kubelet's generated Go code writes them: PodResources{name:"p",
        // namespace:"n", containers:[{name:"c", devices:[{resource_name:"r",
        // device_ids:["d"]}]}]}.
        let dev = [0x0a, 1, b'r', 0x12, 1, b'd'];
        let mut cont = vec![0x0a, 1, b'c', 0x12, dev.len() as u8];
        cont.extend_from_slice(&dev);
        let mut podb = vec![0x0a, 1, b'p', 0x12, 1, b'n', 0x1a, cont.len() as u8];
        podb.extend_from_slice(&cont);
        let mut resp = vec![0x0a, podb.len() as u8];
        resp.extend_from_slice(&podb);
        let got = ListPodResourcesResponse::decode(&resp[..]).unwrap();
        let p = &got.pod_resources[0];
        assert_eq!((p.name.as_str(), p.namespace.as_str()), ("p", "n"));
        let d = &p.containers[0].devices[0];
        assert_eq!(
            (d.resource_name.as_str(), d.device_ids[0].as_str()),
            ("r", "d")
        );
        assert_eq!(got.encode_to_vec(), resp);
    }

    #[tokio::test]
    async fn an_absent_socket_means_no_attribution() {
        let mut p = PodResources::new(Path::new("/nonexistent/kubelet.sock"));
        p.refresh().await;
        assert!(p.devices().is_empty());
    }
}
