//! Prometheus remote write 1.0 requests (snappy-compressed `prometheus.WriteRequest`) built from
//! the simulated fleet, labelled the way Prometheus stores a dcgm-exporter scrape, with the
//! store's own `prometheus.WriteRequest` types (the ones the server decodes).

use gpuwatch_store::ingest::remote_write::proto::{
    Label, Sample as PromSample, TimeSeries, WriteRequest,
};
use prost::Message;

use crate::fleet::{FIELDS, Fleet, Sample};

/// One request body, ready to POST.
#[derive(Debug, Clone)]
pub(crate) struct Body {
    /// The request body: snappy-compressed protobuf for remote write, plain protobuf for OTLP.
    pub bytes: Vec<u8>,
    /// Samples (OTLP: data points) it carries.
    pub samples: u64,
    /// The host it comes from (requests of one host are sent in order).
    pub host: usize,
}

const DRIVER: &str = "580.159.04";
const MODEL: &str = "NVIDIA H100 80GB HBM3";

fn label(name: &str, value: &str) -> Label {
    Label {
        name: name.to_string(),
        value: value.to_string(),
    }
}

/// The labels of one GPU series as Prometheus stores a dcgm-exporter scrape, sorted by name.
pub(crate) fn gpu_labels(
    metric: &str,
    host: &str,
    uuid: &str,
    index: usize,
    pci_bus: &str,
    job: Option<u64>,
) -> Vec<Label> {
    let mut labels = vec![
        label("DCGM_FI_DRIVER_VERSION", DRIVER),
        label("Hostname", host),
        label("UUID", uuid),
        label("__name__", metric),
        label("device", &format!("nvidia{index}")),
        label("gpu", &index.to_string()),
        label("instance", &format!("{host}:9400")),
        label("job", "dcgm-exporter"),
        label("modelName", MODEL),
        label("pci_bus_id", pci_bus),
    ];
    if let Some(j) = job {
        labels.push(label("hpc_job", &j.to_string()));
    }
    labels.sort_by(|a, b| a.name.cmp(&b.name));
    labels
}

/// Compresses a request as remote write 1.0 wants it.
pub(crate) fn encode(req: &WriteRequest) -> Vec<u8> {
    let raw = req.encode_to_vec();
    // Compressing a Vec into a Vec cannot fail for inputs of this size.
    snap::raw::Encoder::new()
        .compress_vec(&raw)
        .unwrap_or_default()
}

/// Builds the request of host `h` for scrape rounds `first..first + rounds` (advancing the
/// fleet). A GPU whose job changes within the rounds gets one series per job, as Prometheus
/// sees a label change.
pub(crate) fn host_request(fleet: &mut Fleet, h: usize, first: u64, rounds: u64) -> Body {
    let mut per_round: Vec<Vec<Sample>> = Vec::with_capacity(rounds as usize);
    let mut buf = Vec::new();
    for k in first..first + rounds {
        fleet.scrape(h, k, &mut buf);
        per_round.push(std::mem::take(&mut buf));
    }
    rounds_request(fleet, h, &per_round)
}

/// The stale-marker value Prometheus writes when a series leaves a scrape.
const STALE_NAN: u64 = 0x7ff0_0000_0000_0002;

/// [`host_request`] with the stale markers a scraping Prometheus sends: when a GPU's job
/// changes, the series of the old job get a stale marker at the first scrape of the new one.
/// `last_jobs` is the job of each GPU of the host in the previous request (`None` before the
/// first), updated here. Markers are not counted in [`Body::samples`].
pub(crate) fn host_request_with_staleness(
    fleet: &mut Fleet,
    h: usize,
    first: u64,
    rounds: u64,
    last_jobs: &mut Option<Vec<Option<u64>>>,
) -> Body {
    let mut per_round: Vec<Vec<Sample>> = Vec::with_capacity(rounds as usize);
    let mut buf = Vec::new();
    for k in first..first + rounds {
        fleet.scrape(h, k, &mut buf);
        per_round.push(std::mem::take(&mut buf));
    }
    let mut body = rounds_request(fleet, h, &per_round);
    let mut req = WriteRequest::default();
    let gpus = fleet.gpus_per_host();
    let host = fleet.host_name(h).to_string();
    let stale = f64::from_bits(STALE_NAN);
    for gpu in 0..gpus {
        let (uuid, pci) = fleet.gpu_ids(h, gpu);
        let mut prev: Option<Option<u64>> = last_jobs.as_ref().map(|j| j[gpu]);
        for r in &per_round {
            let job = r[gpu].job;
            if let Some(p) = prev
                && p != job
            {
                for name in FIELDS {
                    req.timeseries.push(TimeSeries {
                        labels: gpu_labels(name, &host, uuid, gpu, pci, p),
                        samples: vec![PromSample {
                            value: stale,
                            timestamp: r[gpu].time_ms,
                        }],
                    });
                }
            }
            prev = Some(job);
        }
    }
    *last_jobs = per_round.last().map(|r| r.iter().map(|s| s.job).collect());
    if !req.timeseries.is_empty() {
        // The markers go in their own request after the samples, as a separate remote-write
        // batch would carry them.
        let mut bytes = snap::raw::Decoder::new()
            .decompress_vec(&body.bytes)
            .unwrap_or_default();
        bytes.extend(req.encode_to_vec());
        body.bytes = snap::raw::Encoder::new()
            .compress_vec(&bytes)
            .unwrap_or_default();
    }
    body
}

/// The request of host `h` holding the samples of consecutive scrape rounds (`per_round[r][gpu]`,
/// as [`Fleet::scrape`] gave them).
pub(crate) fn rounds_request(fleet: &Fleet, h: usize, per_round: &[Vec<Sample>]) -> Body {
    let gpus = fleet.gpus_per_host();
    let host = fleet.host_name(h).to_string();
    let mut timeseries = Vec::with_capacity(gpus * FIELDS.len());
    let mut samples = 0u64;
    for gpu in 0..gpus {
        let (uuid, pci) = fleet.gpu_ids(h, gpu);
        let (uuid, pci) = (uuid.to_string(), pci.to_string());
        let mut start = 0;
        while start < per_round.len() {
            let job = per_round[start][gpu].job;
            let mut end = start + 1;
            while end < per_round.len() && per_round[end][gpu].job == job {
                end += 1;
            }
            for (f, name) in FIELDS.iter().enumerate() {
                let points: Vec<PromSample> = per_round[start..end]
                    .iter()
                    .map(|round| PromSample {
                        value: round[gpu].values[f],
                        timestamp: round[gpu].time_ms,
                    })
                    .collect();
                samples += points.len() as u64;
                timeseries.push(TimeSeries {
                    labels: gpu_labels(name, &host, &uuid, gpu, &pci, job),
                    samples: points,
                });
            }
            start = end;
        }
    }
    Body {
        bytes: encode(&WriteRequest { timeseries }),
        samples,
        host: h,
    }
}

/// A one-sample request: the power of a probe GPU, used to measure ingest-to-query freshness.
pub(crate) fn probe_request(host: &str, uuid: &str, time_ms: i64, watts: f64) -> Vec<u8> {
    encode(&WriteRequest {
        timeseries: vec![TimeSeries {
            labels: gpu_labels(
                "DCGM_FI_DEV_POWER_USAGE",
                host,
                uuid,
                0,
                "00000000:18:00.0",
                None,
            ),
            samples: vec![PromSample {
                value: watts,
                timestamp: time_ms,
            }],
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::FleetConfig;

    #[test]
    fn request_round_trips_and_counts_samples() {
        let mut fleet = Fleet::new(FleetConfig {
            hosts: 2,
            gpus_per_host: 8,
            interval_ms: 10_000,
            start_ms: 1_790_000_000_000,
            seed: 1,
            job_hosts: 0,
        });
        let body = host_request(&mut fleet, 1, 0, 10);
        assert_eq!(body.samples, 8 * 26 * 10);
        let raw = snap::raw::Decoder::new()
            .decompress_vec(&body.bytes)
            .expect("snappy");
        let req = WriteRequest::decode(raw.as_slice()).expect("protobuf");
        let decoded: usize = req.timeseries.iter().map(|t| t.samples.len()).sum();
        assert_eq!(decoded as u64, body.samples);
        for ts in &req.timeseries {
            let names: Vec<&str> = ts.labels.iter().map(|l| l.name.as_str()).collect();
            let mut sorted = names.clone();
            sorted.sort();
            assert_eq!(names, sorted, "labels sorted");
            assert!(
                ts.labels
                    .iter()
                    .any(|l| l.name == "Hostname" && l.value == "gpu-node-002")
            );
            for w in ts.samples.windows(2) {
                assert!(w[1].timestamp > w[0].timestamp);
            }
        }
    }
}
