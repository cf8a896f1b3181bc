//! The fleet's readings as `gpu_metrics` rows without the OTLP round trip: a year of 10,000
//! GPUs is 87.6 million readings, and building then decoding their OTLP requests (about 40
//! points of 10 attributes each a GPU) took 0.6 s a round, most of the build. The rows are the
//! ones the server's OTLP decoder makes of the agent's request for the same samples: the
//! labels found by the same attribute names ([`LABEL_COLUMNS`]), the values by column; the test
//! below holds the two paths equal on the simulated fleet.

use arrow::array::RecordBatch;
use gpuwatch_agent::collect::{ExtraValue, GpuSample};
use gpuwatch_store::ingest::{Cell, GpuRow, WriteBatch};
use gpuwatch_store::schema::{
    JOB_SHARES_ATTRIBUTE, LABEL_COLUMNS, POD_LABEL_PREFIX, Table, VALUE_COLUMNS,
    canonical_job_shares, job_labels_text,
};

use crate::peers::Result;

/// The attributes the agent puts on a sample's points (and its resource's `host.name`), as text.
fn attributes(s: &GpuSample, host: &str) -> Vec<(String, String)> {
    let mut out = vec![
        ("host.name".to_string(), host.to_string()),
        ("hw.id".into(), s.gpu_uuid.clone()),
        ("gpu.index".into(), s.gpu_index.to_string()),
        ("hw.model".into(), s.gpu_model.clone()),
    ];
    if let Some(mig) = &s.mig_instance {
        out.push(("gpu.mig.instance".into(), mig.clone()));
    }
    let Some(job) = &s.job else { return out };
    out.push(("job.id".into(), job.id.clone()));
    for (k, v) in [("job.user", &job.user), ("job.name", &job.name)] {
        if !v.is_empty() {
            out.push((k.into(), v.clone()));
        }
    }
    out.push(("job.scheduler".into(), job.scheduler.clone()));
    if let Some(k8s) = &job.k8s {
        out.push(("k8s.namespace.name".into(), k8s.namespace.clone()));
        out.push(("k8s.pod.name".into(), k8s.pod.clone()));
        if !k8s.container.is_empty() {
            out.push(("k8s.container.name".into(), k8s.container.clone()));
        }
    }
    for (k, v) in job.extra.attributes() {
        let text = match v {
            ExtraValue::Str(v) => v.to_string(),
            ExtraValue::Int(v) => v.to_string(),
        };
        out.push((k, text));
    }
    out
}

/// A sample's value for one `gpu_metrics` value column.
fn value(s: &GpuSample, column: &str) -> Option<Cell> {
    let f = |v: Option<f64>| v.filter(|x| x.is_finite()).map(Cell::F);
    let i = |v: Option<i64>| v.map(Cell::I);
    match column {
        "gpu_utilization" => f(s.gpu_utilization),
        "memory_utilization" => f(s.memory_utilization),
        "sm_active" => f(s.sm_active),
        "sm_occupancy" => f(s.sm_occupancy),
        "tensor_active" => f(s.tensor_active),
        "dram_active" => f(s.dram_active),
        "fp64_active" => f(s.fp64_active),
        "fp32_active" => f(s.fp32_active),
        "fp16_active" => f(s.fp16_active),
        "gr_engine_active" => f(s.gr_engine_active),
        "memory_used_bytes" => i(s.memory_used_bytes),
        "memory_total_bytes" => i(s.memory_total_bytes),
        "power_watts" => f(s.power_watts),
        "energy_joules" => f(s.energy_joules),
        "temperature_celsius" => f(s.temperature_celsius),
        "memory_temperature_celsius" => f(s.memory_temperature_celsius),
        "sm_clock_mhz" => i(s.sm_clock_mhz),
        "memory_clock_mhz" => i(s.memory_clock_mhz),
        "clock_event_reasons" => i(s.clock_event_reasons),
        "pcie_tx_bytes_per_second" => f(s.pcie_tx_bytes_per_second),
        "pcie_rx_bytes_per_second" => f(s.pcie_rx_bytes_per_second),
        "nvlink_tx_bytes_per_second" => f(s.nvlink_tx_bytes_per_second),
        "nvlink_rx_bytes_per_second" => f(s.nvlink_rx_bytes_per_second),
        "ecc_sbe_volatile_total" => i(s.ecc_sbe_volatile_total),
        "ecc_dbe_volatile_total" => i(s.ecc_dbe_volatile_total),
        "remapped_rows_uncorrectable" => i(s.remapped_rows_uncorrectable),
        "remapped_rows_failure" => i(s.remapped_rows_failure),
        "xid_errors_total" => i(s.xid_errors_total),
        "sm_clock_max_mhz" => i(s.sm_clock_max_mhz),
        "pcie_link_gen" => i(s.pcie_link_gen),
        "pcie_link_width" => i(s.pcie_link_width),
        _ => None,
    }
}

/// One sample's `gpu_metrics` row.
fn row(s: &GpuSample, host: &str) -> GpuRow {
    let attrs = attributes(s, host);
    let find = |names: &[&str]| {
        names
            .iter()
            .find_map(|n| attrs.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone()))
    };
    let mut row = GpuRow::new(s.time_unix_nano as i64);
    for (li, (column, names)) in LABEL_COLUMNS.iter().enumerate() {
        row.labels[li] = if *column == "job_labels" {
            let pairs = attrs
                .iter()
                .filter_map(|(k, v)| {
                    Some((k.strip_prefix(POD_LABEL_PREFIX)?.to_string(), v.clone()))
                })
                .filter(|(k, _)| !k.is_empty())
                .collect();
            job_labels_text(pairs)
        } else {
            find(names)
        };
    }
    row.job_shares = find(&[JOB_SHARES_ATTRIBUTE]).and_then(|t| canonical_job_shares(&t));
    for (vi, c) in VALUE_COLUMNS.iter().enumerate() {
        row.values[vi] = value(s, c.column);
    }
    row
}

/// The `gpu_metrics` rows of the samples, each of the host `names[owners[i]]`.
pub(super) fn gpu_metrics(
    samples: &[GpuSample],
    owners: &[usize],
    names: &[String],
) -> Result<RecordBatch> {
    let rows: Vec<GpuRow> = samples
        .iter()
        .zip(owners)
        .map(|(s, &h)| row(s, &names[h]))
        .collect();
    let wb = WriteBatch::from_rows(&rows, &[]).map_err(|e| format!("gpu_metrics rows: {e}"))?;
    Ok(wb
        .batches
        .into_iter()
        .find(|(t, _)| *t == Table::GpuMetrics)
        .map(|(_, b)| b)
        .unwrap_or_else(|| RecordBatch::new_empty(Table::GpuMetrics.schema())))
}

#[cfg(test)]
mod tests {
    use gpuwatch_agent::{Fleet as Node, NodeOptions, Source};
    use gpuwatch_store::persist::sort_batch;

    use super::*;

    #[test]
    fn the_rows_are_those_the_otlp_decoder_makes_of_the_agents_requests() {
        const HOUR: u64 = 3_600_000_000_000;
        let t0 = 1_790_000_000_000_000_000u64;
        let mut jobs = 0;
        for h in 0..6u64 {
            let options = NodeOptions {
                demo_jobs: h % 2 == 0,
                first_job_id: Some(100 + h * 1000),
                standing_job: None,
                job_time_scale: 6.0,
                fault_rate_scale: 50.0,
            };
            let mut node = Node::with_options(8, h, options);
            let host = format!("node-{h}");
            for k in 0..48 {
                let t = t0 + k * HOUR;
                let samples = node.collect(t).expect("samples");
                jobs += samples.iter().filter(|s| s.job.is_some()).count();
                let req = gpuwatch_agent::encode(&samples, &[("host.name".into(), host.clone())]);
                let (wb, _) =
                    gpuwatch_store::ingest::otlp::to_write_batch(&req, t as i64).expect("decode");
                let decoded = wb
                    .batches
                    .into_iter()
                    .find(|(t, _)| *t == Table::GpuMetrics)
                    .expect("gpu rows")
                    .1;
                let direct = gpu_metrics(&samples, &vec![0; samples.len()], &[host.clone()])
                    .expect("direct");
                let want = sort_batch(Table::GpuMetrics, &decoded).expect("sort");
                let got = sort_batch(Table::GpuMetrics, &direct).expect("sort");
                assert_eq!(got, want, "node {h}, hour {k}");
            }
        }
        assert!(jobs > 100, "the fleet ran jobs: {jobs} job samples");
    }
}
