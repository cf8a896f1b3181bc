//! Reading a recorded GPU trace: `SHAPE.csv` or `SHAPE.csv.gz` (one row per GPU per reading)
//! and, beside it, an optional `SHAPE.json` with the job and the GPU's fixed facts.
//!
//! Columns are found by name, so a trace may carry any subset: the recorder's
//! (tests/gpu/traces/record.py: NVML and GPM in raw units, `util_gpu_pct`, `gpm_sm_util`, …),
//! the older `shared/data` set (no link or clock columns), or gpuwatch's own `gpu_metrics`
//! column names (ratios, bytes, as `gpuwatch sql … --format csv` prints them). A value that is
//! empty, `nan` or not a number is not read (null, never 0). Rows are grouped by `gpu_uuid`, so
//! a file may hold several GPUs.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use gpuwatch_agent::GpuSample;

/// What the JSON beside a trace says (every field optional).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub(crate) struct Meta {
    pub job_id: Option<String>,
    pub job_user: Option<String>,
    pub job_name: Option<String>,
    pub gpu_model: Option<String>,
    pub sm_clock_max_mhz: Option<i64>,
}

/// One GPU's readings, in time order: (time in ns, the sample without job or time).
pub(crate) type Series = Vec<(i64, GpuSample)>;

/// The workload's own cumulative counters in a trace, by column, and the counter each is sent
/// as (docs/cost.md, "Work done").
pub(crate) const WORK_COLUMNS: [(&str, &str); 3] = [
    ("work_samples", "job.samples"),
    ("work_tokens", "job.tokens"),
    ("work_steps", "job.steps"),
];

/// A trace: its name (the file's stem), its metadata, its GPUs' series by UUID, and the
/// workload's own counters (`job.samples`, …) as (time in ns, cumulative value), by counter.
#[derive(Debug, Clone)]
pub(crate) struct Trace {
    pub name: String,
    pub meta: Meta,
    pub gpus: BTreeMap<String, Series>,
    pub work: BTreeMap<&'static str, Vec<(i64, f64)>>,
}

impl Trace {
    /// First and last reading over every GPU, ns.
    pub(crate) fn span(&self) -> (i64, i64) {
        let times = self.gpus.values().flat_map(|s| s.iter().map(|(t, _)| *t));
        let (lo, hi) = times.fold((i64::MAX, i64::MIN), |(lo, hi), t| (lo.min(t), hi.max(t)));
        if lo > hi { (0, 0) } else { (lo, hi) }
    }
}

/// One field of a CSV line; quotes per RFC 4180.
fn split_csv(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', true) => quoted = false,
            ('"', false) if cur.is_empty() => quoted = true,
            (',', false) => out.push(std::mem::take(&mut cur)),
            (c, _) => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// A column of the file and the factor that brings it to gpuwatch's unit.
type Source = (&'static str, f64);

const PCT: f64 = 0.01;
const MIB: f64 = 1_048_576.0;

/// For each `gpu_metrics` column the replay fills: where to read it, first present wins.
const FLOATS: &[(&str, &[Source])] = &[
    (
        "gpu_utilization",
        &[("util_gpu_pct", PCT), ("gpu_utilization", 1.0)],
    ),
    (
        "memory_utilization",
        &[("util_mem_pct", PCT), ("memory_utilization", 1.0)],
    ),
    ("sm_active", &[("gpm_sm_util", PCT), ("sm_active", 1.0)]),
    (
        "sm_occupancy",
        &[("gpm_sm_occupancy", PCT), ("sm_occupancy", 1.0)],
    ),
    (
        "tensor_active",
        &[("gpm_tensor_util", PCT), ("tensor_active", 1.0)],
    ),
    (
        "dram_active",
        &[("gpm_dram_bw_util", PCT), ("dram_active", 1.0)],
    ),
    (
        "fp64_active",
        &[("gpm_fp64_util", PCT), ("fp64_active", 1.0)],
    ),
    (
        "fp32_active",
        &[("gpm_fp32_util", PCT), ("fp32_active", 1.0)],
    ),
    (
        "fp16_active",
        &[("gpm_fp16_util", PCT), ("fp16_active", 1.0)],
    ),
    ("power_watts", &[("power_mw", 0.001), ("power_watts", 1.0)]),
    (
        "energy_joules",
        &[("energy_mj", 0.001), ("energy_joules", 1.0)],
    ),
    (
        "temperature_celsius",
        &[("temp_c", 1.0), ("temperature_celsius", 1.0)],
    ),
    (
        "memory_temperature_celsius",
        &[("mem_temp_c", 1.0), ("memory_temperature_celsius", 1.0)],
    ),
    // GPM's PCIe rates where the GPU has GPM (what the agent sends), else NVML's.
    (
        "pcie_tx_bytes_per_second",
        &[
            ("gpm_pcie_tx_mib_s", MIB),
            ("pcie_tx_kb_s", 1024.0),
            ("pcie_tx_bytes_per_second", 1.0),
        ],
    ),
    (
        "pcie_rx_bytes_per_second",
        &[
            ("gpm_pcie_rx_mib_s", MIB),
            ("pcie_rx_kb_s", 1024.0),
            ("pcie_rx_bytes_per_second", 1.0),
        ],
    ),
    (
        "nvlink_tx_bytes_per_second",
        &[
            ("gpm_nvlink_tx_mib_s", MIB),
            ("nvlink_tx_bytes_per_second", 1.0),
        ],
    ),
    (
        "nvlink_rx_bytes_per_second",
        &[
            ("gpm_nvlink_rx_mib_s", MIB),
            ("nvlink_rx_bytes_per_second", 1.0),
        ],
    ),
];

const INTS: &[(&str, &[Source])] = &[
    (
        "memory_used_bytes",
        &[("fb_used_bytes", 1.0), ("memory_used_bytes", 1.0)],
    ),
    (
        "memory_total_bytes",
        &[("fb_total_bytes", 1.0), ("memory_total_bytes", 1.0)],
    ),
    ("sm_clock_mhz", &[("sm_clock_mhz", 1.0)]),
    (
        "memory_clock_mhz",
        &[("mem_clock_mhz", 1.0), ("memory_clock_mhz", 1.0)],
    ),
    ("clock_event_reasons", &[("clock_event_reasons", 1.0)]),
    (
        "ecc_sbe_volatile_total",
        &[("ecc_sbe_volatile", 1.0), ("ecc_sbe_volatile_total", 1.0)],
    ),
    (
        "ecc_dbe_volatile_total",
        &[("ecc_dbe_volatile", 1.0), ("ecc_dbe_volatile_total", 1.0)],
    ),
    ("sm_clock_max_mhz", &[("sm_clock_max_mhz", 1.0)]),
    ("pcie_link_gen", &[("pcie_link_gen", 1.0)]),
    ("pcie_link_width", &[("pcie_link_width", 1.0)]),
];

/// The sample field of a float column.
fn float_slot<'a>(s: &'a mut GpuSample, column: &str) -> Option<&'a mut Option<f64>> {
    Some(match column {
        "gpu_utilization" => &mut s.gpu_utilization,
        "memory_utilization" => &mut s.memory_utilization,
        "sm_active" => &mut s.sm_active,
        "sm_occupancy" => &mut s.sm_occupancy,
        "tensor_active" => &mut s.tensor_active,
        "dram_active" => &mut s.dram_active,
        "fp64_active" => &mut s.fp64_active,
        "fp32_active" => &mut s.fp32_active,
        "fp16_active" => &mut s.fp16_active,
        "power_watts" => &mut s.power_watts,
        "energy_joules" => &mut s.energy_joules,
        "temperature_celsius" => &mut s.temperature_celsius,
        "memory_temperature_celsius" => &mut s.memory_temperature_celsius,
        "pcie_tx_bytes_per_second" => &mut s.pcie_tx_bytes_per_second,
        "pcie_rx_bytes_per_second" => &mut s.pcie_rx_bytes_per_second,
        "nvlink_tx_bytes_per_second" => &mut s.nvlink_tx_bytes_per_second,
        "nvlink_rx_bytes_per_second" => &mut s.nvlink_rx_bytes_per_second,
        _ => return None,
    })
}

/// The sample field of an integer column.
fn int_slot<'a>(s: &'a mut GpuSample, column: &str) -> Option<&'a mut Option<i64>> {
    Some(match column {
        "memory_used_bytes" => &mut s.memory_used_bytes,
        "memory_total_bytes" => &mut s.memory_total_bytes,
        "sm_clock_mhz" => &mut s.sm_clock_mhz,
        "memory_clock_mhz" => &mut s.memory_clock_mhz,
        "clock_event_reasons" => &mut s.clock_event_reasons,
        "ecc_sbe_volatile_total" => &mut s.ecc_sbe_volatile_total,
        "ecc_dbe_volatile_total" => &mut s.ecc_dbe_volatile_total,
        "sm_clock_max_mhz" => &mut s.sm_clock_max_mhz,
        "pcie_link_gen" => &mut s.pcie_link_gen,
        "pcie_link_width" => &mut s.pcie_link_width,
        _ => return None,
    })
}

fn number(text: &str) -> Option<f64> {
    text.trim().parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Time of a row in ns: `time_unix_ns`, or `time` as integer ns or RFC 3339.
fn row_time(col: &BTreeMap<&str, usize>, fields: &[String]) -> Option<i64> {
    let get = |name: &str| col.get(name).and_then(|&i| fields.get(i)).map(|s| s.trim());
    if let Some(t) = get("time_unix_ns").and_then(|t| t.parse::<i64>().ok()) {
        return Some(t);
    }
    let t = get("time")?;
    t.parse::<i64>().ok().or_else(|| {
        chrono::DateTime::parse_from_rfc3339(&t.replace(' ', "T"))
            .ok()
            .and_then(|d| d.timestamp_nanos_opt())
    })
}

fn read_text(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if path.extension().is_some_and(|e| e == "gz") {
        let mut text = String::new();
        flate2::read::GzDecoder::new(bytes.as_slice())
            .read_to_string(&mut text)
            .map_err(|e| format!("{}: not a gzip'd text file: {e}", path.display()))?;
        Ok(text)
    } else {
        String::from_utf8(bytes).map_err(|e| format!("{}: not UTF-8 text: {e}", path.display()))
    }
}

/// The file's stem without `.csv` / `.csv.gz`, and the JSON path beside it.
fn names(path: &Path) -> (String, PathBuf) {
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let plain = file.strip_suffix(".gz").unwrap_or(&file);
    let stem = plain.strip_suffix(".csv").unwrap_or(plain).to_string();
    (stem.clone(), path.with_file_name(format!("{stem}.json")))
}

/// The GPU sample of one CSV row (without job or time), columns found by name.
fn row_sample(
    col: &BTreeMap<&str, usize>,
    fields: &[String],
    meta: &Meta,
    uuid: &str,
) -> GpuSample {
    let text = |name: &str| col.get(name).and_then(|&i| fields.get(i)).map(|s| s.trim());
    let model = text("gpu_model")
        .filter(|m| !m.is_empty())
        .map(str::to_string)
        .or_else(|| meta.gpu_model.clone())
        .unwrap_or_else(|| "unknown".to_string());
    let mut s = GpuSample::empty(0, uuid.to_string(), 0, model);
    for (column, sources) in FLOATS {
        let v = sources
            .iter()
            .find_map(|(src, scale)| text(src).and_then(number).map(|v| v * scale));
        if let Some(slot) = float_slot(&mut s, column) {
            *slot = v;
        }
    }
    for (column, sources) in INTS {
        let v = sources.iter().find_map(|(src, scale)| {
            text(src)
                .and_then(number)
                .map(|v| (v * scale).round() as i64)
        });
        if let Some(slot) = int_slot(&mut s, column) {
            *slot = v;
        }
    }
    if s.sm_clock_max_mhz.is_none() {
        s.sm_clock_max_mhz = meta.sm_clock_max_mhz;
    }
    s
}

/// Reads a trace and the JSON beside it (if any).
pub(crate) fn read(path: &Path) -> Result<Trace, String> {
    let (name, json) = names(path);
    let meta: Meta = match std::fs::read_to_string(&json) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|e| format!("{}: not the trace's JSON: {e}", json.display()))?,
        Err(_) => Meta::default(),
    };
    let text = read_text(path)?;
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = split_csv(
        lines
            .next()
            .ok_or_else(|| format!("{}: empty file", path.display()))?,
    );
    let col: BTreeMap<&str, usize> = header
        .iter()
        .enumerate()
        .map(|(i, h)| (h.trim(), i))
        .collect();
    if !col.contains_key("time_unix_ns") && !col.contains_key("time") {
        return Err(format!(
            "{}: no time column: the header needs time_unix_ns (Unix ns) or time",
            path.display()
        ));
    }
    let mut gpus: BTreeMap<String, Series> = BTreeMap::new();
    let mut work: BTreeMap<&'static str, Vec<(i64, f64)>> = BTreeMap::new();
    for (n, line) in lines.enumerate() {
        let fields = split_csv(line);
        let row = n + 2;
        let t = row_time(&col, &fields)
            .ok_or_else(|| format!("{}:{row}: no readable time", path.display()))?;
        let text = |name: &str| col.get(name).and_then(|&i| fields.get(i)).map(|s| s.trim());
        for (column, counter) in WORK_COLUMNS {
            if let Some(v) = text(column).and_then(number).filter(|v| *v >= 0.0) {
                work.entry(counter).or_default().push((t, v));
            }
        }
        let uuid = text("gpu_uuid")
            .filter(|u| !u.is_empty())
            .unwrap_or("GPU-replay-0")
            .to_string();
        let s = row_sample(&col, &fields, &meta, &uuid);
        gpus.entry(uuid).or_default().push((t, s));
    }
    if gpus.is_empty() {
        return Err(format!("{}: no rows", path.display()));
    }
    for (index, series) in gpus.values_mut().enumerate() {
        series.sort_by_key(|(t, _)| *t);
        for (_, s) in series.iter_mut() {
            s.gpu_index = index as u32;
        }
    }
    for series in work.values_mut() {
        series.sort_by_key(|(t, _)| *t);
    }
    Ok(Trace {
        name,
        meta,
        gpus,
        work,
    })
}

/// Keeps every `n`th reading of each GPU, as an agent sampling `n` times slower would see it:
/// the GPM activities and PCIe / NVLink rates are means over the readings in between (GPM
/// measures between two samples), the rest (utilisation, clocks, memory, power) the kept
/// reading's own.
pub(crate) fn every(series: &Series, n: usize) -> Series {
    if n <= 1 {
        return series.clone();
    }
    let mut out = Vec::new();
    let mut start = 0;
    while start + n <= series.len() {
        let window = &series[start..start + n];
        let (t, mut kept) = window[n - 1].clone();
        let mut copies: Vec<GpuSample> = window.iter().map(|(_, s)| s.clone()).collect();
        for column in [
            "sm_active",
            "sm_occupancy",
            "tensor_active",
            "dram_active",
            "fp64_active",
            "fp32_active",
            "fp16_active",
            "pcie_tx_bytes_per_second",
            "pcie_rx_bytes_per_second",
            "nvlink_tx_bytes_per_second",
            "nvlink_rx_bytes_per_second",
        ] {
            let vals: Vec<f64> = copies
                .iter_mut()
                .filter_map(|s| float_slot(s, column).and_then(|v| *v))
                .collect();
            if let Some(slot) = float_slot(&mut kept, column) {
                *slot = (!vals.is_empty()).then(|| vals.iter().sum::<f64>() / vals.len() as f64);
            }
        }
        out.push((t, kept));
        start += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    #[test]
    fn any_column_set_reads_and_missing_values_stay_null() {
        let dir = tempfile::tempdir().expect("tempdir");
        // The shared/data set: no link, no clock maximum, one GPU without GPM.
        let p = write(
            dir.path(),
            "mixed.csv",
            "time_unix_ns,gpu_uuid,gpu_model,util_gpu_pct,gpm_sm_util,pcie_rx_kb_s,procs\n\
             2000000000,GPU-b,NVIDIA A100-SXM4-40GB,50,,1024,\"1;2\"\n\
             1000000000,GPU-a,NVIDIA H100 80GB HBM3,97,95.5,2048,\n\
             3000000000,GPU-a,NVIDIA H100 80GB HBM3,nan,95,,\n",
        );
        let t = read(&p).expect("read");
        assert_eq!(t.name, "mixed");
        assert_eq!(t.gpus.len(), 2);
        assert_eq!(t.span(), (1_000_000_000, 3_000_000_000));
        let a = &t.gpus["GPU-a"];
        assert_eq!(a[0].1.gpu_utilization, Some(0.97));
        assert!((a[0].1.sm_active.expect("sm") - 0.955).abs() < 1e-12);
        assert_eq!(a[0].1.pcie_rx_bytes_per_second, Some(2048.0 * 1024.0));
        assert_eq!(a[1].1.gpu_utilization, None, "nan is not read");
        assert_eq!(a[0].1.pcie_link_gen, None);
        let b = &t.gpus["GPU-b"];
        assert_eq!(b[0].1.sm_active, None, "no GPM: null, not 0");
        assert_eq!(b[0].1.gpu_index, 1);
    }

    #[test]
    fn gpuwatch_columns_and_rfc3339_times_read_too() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = write(
            dir.path(),
            "export.csv",
            "time,gpu_uuid,gpu_utilization,sm_active,pcie_link_gen\n\
             2027-01-15T08:00:00Z,GPU-x,0.5,0.25,4\n",
        );
        let t = read(&p).expect("read");
        let x = &t.gpus["GPU-x"][0];
        assert_eq!(x.0, 1_800_000_000_000_000_000);
        assert_eq!(x.1.sm_active, Some(0.25));
        assert_eq!(x.1.pcie_link_gen, Some(4));
        let bad = write(dir.path(), "bad.csv", "gpu_uuid,util_gpu_pct\nGPU-a,3\n");
        assert!(read(&bad).expect_err("no time").contains("time_unix_ns"));
        let bad = write(
            dir.path(),
            "bad2.csv",
            "time_unix_ns,gpu_uuid\nsoon,GPU-a\n",
        );
        assert!(read(&bad).expect_err("bad time").contains(":2:"));
    }

    #[test]
    fn every_nth_reading_averages_gpm_and_keeps_the_rest() {
        let mut series = Series::new();
        for (i, sm) in [0.1, 0.2, 0.3, 0.4].iter().enumerate() {
            let mut s = GpuSample::empty(0, "GPU-a".into(), 0, "m".into());
            s.sm_active = Some(*sm);
            s.gpu_utilization = Some(i as f64);
            series.push((i as i64, s));
        }
        let two = every(&series, 2);
        assert_eq!(two.len(), 2);
        assert_eq!(two[0].0, 1);
        assert!((two[0].1.sm_active.expect("sm") - 0.15).abs() < 1e-12);
        assert_eq!(two[1].1.gpu_utilization, Some(3.0));
    }
}
