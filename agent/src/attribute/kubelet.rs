//! Pod labels from the kubelet: the pod-resources API names the pod holding each GPU but not its
//! labels, so with `--pod-label` the agent also reads the kubelet's own `GET /pods` (the node's
//! pods with their metadata, the answer `kubectl get --raw /api/v1/nodes/<node>/proxy/pods`
//! relays) and keeps the named labels of each pod. They go out as `k8s.pod.label.<name>` on the
//! pod's samples and fill `job_labels` on the server (`team=vision,project=llm`), which
//! statements and budgets group by.
//!
//! The kubelet wants a bearer token allowed `get` on `nodes/proxy` (the chart's ClusterRole
//! grants it to the agent's service account); the token file is read at every call, since
//! projected tokens rotate. Its serving certificate is often self-signed: `--kubelet-ca-file`
//! names the CA that signed it, or `--kubelet-insecure-tls` skips the check, as metrics-server's
//! flag of the same name does. The call is made only while the pod-resources API lists pods on
//! the node, at most every [`REFRESH`]; when it fails, the last labels are kept for
//! [`super::kubernetes::STALE_AFTER_FAILURES`] more failures, then dropped.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Deserialize;
use tracing::{debug, warn};

use crate::error::{Error, Result};

/// Default `--kubelet-url`: the kubelet of this node, as a host-network pod sees it.
pub const DEFAULT_KUBELET_URL: &str = "https://127.0.0.1:10250";
/// Default `--kubelet-token-file`: the pod's service account token.
pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
/// Least time between two reads of `/pods`.
pub const REFRESH: Duration = Duration::from_secs(10);
/// Time one read may take.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Largest `/pods` answer read (a node's 110 pods take a few MB).
const MAX_BODY_BYTES: usize = 64 << 20;

/// `(namespace, pod)` → the pod's labels named by `--pod-label`, sorted by name.
pub type LabelMap = HashMap<(String, String), Vec<(String, String)>>;

/// Where and how to read the kubelet's pods, and which labels to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletOptions {
    /// The labels to keep (`--pod-label`); none: the kubelet is never asked.
    pub labels: Vec<String>,
    /// Base URL of the kubelet.
    pub url: String,
    /// Bearer token file (skipped when absent).
    pub token_file: PathBuf,
    /// CA certificates of the kubelet's serving certificate (PEM).
    pub ca_file: Option<PathBuf>,
    /// Accept any serving certificate.
    pub insecure_tls: bool,
}

impl Default for KubeletOptions {
    fn default() -> Self {
        KubeletOptions {
            labels: Vec::new(),
            url: DEFAULT_KUBELET_URL.into(),
            token_file: PathBuf::from(DEFAULT_TOKEN_FILE),
            ca_file: None,
            insecure_tls: false,
        }
    }
}

/// Whether `name` is a Kubernetes label key: an optional DNS prefix and `/`, then at most 63
/// letters, digits, `-`, `_`, `.`.
pub fn valid_label_name(name: &str) -> bool {
    let key = name.rsplit_once('/').map_or(name, |(_, k)| k);
    let ok = |s: &str| {
        s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
    };
    !key.is_empty() && key.len() <= 63 && name.len() <= 317 && ok(name)
}

#[derive(Deserialize)]
struct PodList {
    #[serde(default)]
    items: Vec<Pod>,
}

#[derive(Deserialize)]
struct Pod {
    #[serde(default)]
    metadata: Metadata,
}

#[derive(Deserialize, Default)]
struct Metadata {
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    labels: HashMap<String, String>,
}

/// The labels named `keep` of each pod of a `/pods` answer.
pub fn parse_pods(body: &[u8], keep: &[String]) -> std::result::Result<LabelMap, String> {
    let list: PodList = serde_json::from_slice(body).map_err(|e| format!("not a pod list: {e}"))?;
    let mut map = LabelMap::new();
    for pod in list.items {
        let m = pod.metadata;
        if m.name.is_empty() {
            continue;
        }
        let mut labels: Vec<(String, String)> = keep
            .iter()
            .filter_map(|k| m.labels.get(k).map(|v| (k.clone(), v.clone())))
            .collect();
        labels.sort();
        map.insert((m.namespace, m.name), labels);
    }
    Ok(map)
}

/// Reads the kubelet's pods now and then and keeps the labels of the last good answer.
#[derive(Debug)]
pub struct PodLabelSource {
    opts: KubeletOptions,
    client: reqwest::Client,
    map: LabelMap,
    last: Option<Instant>,
    failures: u32,
    warned: bool,
}

impl PodLabelSource {
    /// A source for `opts`; `None` when no label is asked for.
    pub fn new(opts: &KubeletOptions) -> Result<Option<Self>> {
        if opts.labels.is_empty() {
            return Ok(None);
        }
        let mut builder = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .connect_timeout(TIMEOUT)
            .danger_accept_invalid_certs(opts.insecure_tls);
        if let Some(ca) = &opts.ca_file {
            let pem = crate::export::read_pem(ca, "kubelet CA file")?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| Error::Invalid(format!("CA certificates in {}: {e}", ca.display())))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        let client = builder.build().map_err(Error::HttpClient)?;
        Ok(Some(PodLabelSource {
            opts: opts.clone(),
            client,
            map: LabelMap::new(),
            last: None,
            failures: 0,
            warned: false,
        }))
    }

    /// The labels of the last good answer.
    pub fn labels(&self) -> &LabelMap {
        &self.map
    }

    /// Reads `/pods` again when [`REFRESH`] has passed since the last read.
    pub async fn refresh(&mut self) {
        if self.last.is_some_and(|t| t.elapsed() < REFRESH) {
            return;
        }
        self.last = Some(Instant::now());
        match self.fetch().await {
            Ok(map) => {
                debug!(pods = map.len(), "kubelet pods read");
                self.map = map;
                self.failures = 0;
                self.warned = false;
            }
            Err(reason) => {
                self.failures += 1;
                if self.warned {
                    debug!(url = %self.opts.url, error = %reason, "kubelet /pods failed");
                } else {
                    warn!(url = %self.opts.url, error = %reason, "kubelet /pods failed: pods go without their labels; check --kubelet-url, the token's nodes/proxy permission and --kubelet-ca-file");
                    self.warned = true;
                }
                if self.failures > super::kubernetes::STALE_AFTER_FAILURES {
                    self.map.clear();
                }
            }
        }
    }

    async fn fetch(&self) -> std::result::Result<LabelMap, String> {
        let url = format!("{}/pods", self.opts.url.trim_end_matches('/'));
        let mut req = self.client.get(&url);
        if let Ok(token) = std::fs::read_to_string(&self.opts.token_file) {
            req = req.bearer_auth(token.trim());
        }
        let mut resp = req.send().await.map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("answered {}", resp.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(format!("answer over {MAX_BODY_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        parse_pods(&body, &self.opts.labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_keep_only_the_named_labels() {
        let body = br#"{"kind":"PodList","items":[
            {"metadata":{"namespace":"ml","name":"train-0","labels":{"team":"vision","project":"llm","pod-template-hash":"x"}}},
            {"metadata":{"namespace":"ml","name":"bare"}},
            {"metadata":{"namespace":"x"}},
            {"spec":{}}
        ]}"#;
        let keep = vec!["team".to_string(), "project".to_string()];
        let m = parse_pods(body, &keep).expect("parse");
        assert_eq!(
            m[&("ml".to_string(), "train-0".to_string())],
            [
                ("project".to_string(), "llm".to_string()),
                ("team".to_string(), "vision".to_string())
            ]
        );
        assert!(m[&("ml".to_string(), "bare".to_string())].is_empty());
        assert_eq!(m.len(), 2);
        assert!(parse_pods(b"<html>", &keep).is_err());
        assert!(parse_pods(br#"{"items": 3}"#, &keep).is_err());
    }

    #[test]
    fn label_names_are_checked() {
        for ok in ["team", "app.kubernetes.io/name", "a_b-c.d"] {
            assert!(valid_label_name(ok), "{ok}");
        }
        for bad in ["", "a b", "x/", "team=1", "a,b", &"x".repeat(64)] {
            assert!(!valid_label_name(bad), "{bad}");
        }
    }
}
