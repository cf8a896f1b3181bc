//! The tables' Arrow schemas and the OTLP names that fill `gpu_metrics` (docs/schema.md).

use std::sync::{Arc, LazyLock};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

mod ledger;
pub use ledger::{JOB_LEDGER_KEY, declare_job_ledger};

/// The type of a value column of `gpu_metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    /// Float64: ratios, watts, joules, degrees, rates.
    Float,
    /// Int64: bytes, MHz, bitmasks, counts.
    Int,
}

/// A value column of `gpu_metrics` and the OTLP metric that fills it.
#[derive(Debug, Clone, Copy)]
pub struct ValueColumn {
    /// Column name in SQL.
    pub column: &'static str,
    /// OTLP metric name on the wire.
    pub otlp: &'static str,
    /// Arrow type of the column.
    pub ty: ValueType,
    /// Unit, as UCUM text (OTLP `unit`).
    pub unit: &'static str,
}

const fn f(column: &'static str, otlp: &'static str, unit: &'static str) -> ValueColumn {
    ValueColumn {
        column,
        otlp,
        ty: ValueType::Float,
        unit,
    }
}

const fn i(column: &'static str, otlp: &'static str, unit: &'static str) -> ValueColumn {
    ValueColumn {
        column,
        otlp,
        ty: ValueType::Int,
        unit,
    }
}

/// Every value column of `gpu_metrics`, in schema order.
pub const VALUE_COLUMNS: &[ValueColumn] = &[
    f("gpu_utilization", "hw.gpu.utilization", "1"),
    f(
        "memory_utilization",
        "gpu.memory_controller.utilization",
        "1",
    ),
    f("sm_active", "gpu.sm.active", "1"),
    f("sm_occupancy", "gpu.sm.occupancy", "1"),
    f("tensor_active", "gpu.tensor.active", "1"),
    f("dram_active", "gpu.dram.active", "1"),
    f("fp64_active", "gpu.fp64.active", "1"),
    f("fp32_active", "gpu.fp32.active", "1"),
    f("fp16_active", "gpu.fp16.active", "1"),
    i("memory_used_bytes", "hw.gpu.memory.usage", "By"),
    i("memory_total_bytes", "hw.gpu.memory.limit", "By"),
    f("power_watts", "hw.power", "W"),
    f("energy_joules", "hw.energy", "J"),
    f("temperature_celsius", "hw.temperature", "Cel"),
    f(
        "memory_temperature_celsius",
        "gpu.memory.temperature",
        "Cel",
    ),
    i("sm_clock_mhz", "gpu.clock.sm", "MHz"),
    i("memory_clock_mhz", "gpu.clock.memory", "MHz"),
    i("clock_event_reasons", "gpu.clock.event_reasons", "1"),
    f("pcie_tx_bytes_per_second", "gpu.pcie.transmit.rate", "By/s"),
    f("pcie_rx_bytes_per_second", "gpu.pcie.receive.rate", "By/s"),
    f(
        "nvlink_tx_bytes_per_second",
        "gpu.nvlink.transmit.rate",
        "By/s",
    ),
    f(
        "nvlink_rx_bytes_per_second",
        "gpu.nvlink.receive.rate",
        "By/s",
    ),
    i("ecc_sbe_volatile_total", "gpu.ecc.sbe.volatile", "{error}"),
    i("ecc_dbe_volatile_total", "gpu.ecc.dbe.volatile", "{error}"),
    i(
        "remapped_rows_uncorrectable",
        "gpu.remapped_rows.uncorrectable",
        "{row}",
    ),
    i("remapped_rows_failure", "gpu.remapped_rows.failure", "1"),
    i("xid_errors_total", "gpu.xid.errors", "{error}"),
    // Added after the first release: tables created earlier gain them on open (delta/mod.rs).
    f("gr_engine_active", "gpu.graphics.active", "1"),
    i("sm_clock_max_mhz", "gpu.clock.sm.max", "MHz"),
    i("pcie_link_gen", "gpu.pcie.link.generation", "1"),
    i("pcie_link_width", "gpu.pcie.link.width", "{lane}"),
];

/// The label columns of `gpu_metrics` after `time`, in schema order, with the OTLP attribute
/// names that fill them (the first name found wins).
pub const LABEL_COLUMNS: &[(&str, &[&str])] = &[
    ("host", &["host.name"]),
    ("gpu_uuid", &["hw.id", "gpu.uuid"]),
    ("gpu_index", &["gpu.index"]),
    ("gpu_model", &["hw.model"]),
    ("mig_instance", &["gpu.mig.instance"]),
    ("job_id", &["job.id"]),
    ("job_user", &["job.user"]),
    ("job_name", &["job.name"]),
    ("scheduler", &["job.scheduler"]),
    ("k8s_namespace", &["k8s.namespace.name"]),
    ("k8s_pod", &["k8s.pod.name"]),
    ("k8s_container", &["k8s.container.name"]),
    // Added after the first release (chargeback): tables created earlier gain them on open.
    ("job_account", &["job.account"]),
    ("job_partition", &["job.partition"]),
    ("job_qos", &["job.qos"]),
    ("job_array_id", &["job.array_id"]),
    ("job_array_task_id", &["job.array_task_id"]),
    ("job_time_limit_seconds", &["job.time_limit_seconds"]),
    ("job_labels", &[POD_LABEL_PREFIX]),
];

/// Prefix of the OTLP attributes that fill `job_labels`: `k8s.pod.label.<name>`, stored as
/// `name=value` pairs sorted by name and joined by `,` ([`job_labels_text`]).
pub const POD_LABEL_PREFIX: &str = "k8s.pod.label.";

/// The `job_labels` text of `(name, value)` pairs: sorted by name, `name=value` joined by `,`;
/// `None` when there are none. A `,` or `=` inside a name or value is replaced by `_`, so the
/// text always splits back into the same pairs (Kubernetes label names and values never hold
/// either).
pub fn job_labels_text(mut pairs: Vec<(String, String)>) -> Option<String> {
    if pairs.is_empty() {
        return None;
    }
    pairs.sort();
    pairs.dedup_by(|a, b| a.0 == b.0);
    let clean = |s: &str| s.replace([',', '='], "_");
    Some(
        pairs
            .iter()
            .map(|(k, v)| format!("{}={}", clean(k), clean(v)))
            .collect::<Vec<_>>()
            .join(","),
    )
}

/// Index of a value column by its OTLP name.
pub fn value_index(otlp_name: &str) -> Option<usize> {
    VALUE_COLUMNS.iter().position(|c| c.otlp == otlp_name)
}

/// The type of column `time` in every table.
pub fn time_type() -> DataType {
    DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()))
}

static GPU_METRICS: LazyLock<SchemaRef> = LazyLock::new(|| {
    let mut fields = vec![Field::new("time", time_type(), false)];
    for (name, _) in LABEL_COLUMNS {
        let (ty, nullable) = match *name {
            "host" | "gpu_uuid" => (DataType::Utf8, false),
            "gpu_index" => (DataType::Int32, true),
            "job_time_limit_seconds" => (DataType::Int64, true),
            _ => (DataType::Utf8, true),
        };
        fields.push(Field::new(*name, ty, nullable));
    }
    for c in VALUE_COLUMNS {
        let ty = match c.ty {
            ValueType::Float => DataType::Float64,
            ValueType::Int => DataType::Int64,
        };
        fields.push(Field::new(c.column, ty, true));
    }
    fields.push(Field::new(GPU_LABELS_COLUMN, DataType::Utf8, true));
    fields.push(Field::new(JOB_SHARES_COLUMN, DataType::Utf8, true));
    Arc::new(Schema::new(fields))
});

/// The very last column of `gpu_metrics` (added after `series_labels`): when several jobs used
/// the GPU in the sample, each job's share of it, `id=share` pairs sorted by id and joined by
/// `,` (the row's own `job_id` among them; the shares add up to 1), from the agent's
/// `job.shares`; null when one job or none held the GPU. The `jobs` view bills each job its
/// share of the GPU's time and energy (docs/cost.md "Shared GPUs"). Not a label of the
/// rollups: a share changes every sample.
pub const JOB_SHARES_COLUMN: &str = "job_shares";

/// The OTLP attribute that fills [`JOB_SHARES_COLUMN`].
pub const JOB_SHARES_ATTRIBUTE: &str = "job.shares";

/// The [`JOB_SHARES_COLUMN`] text written for `text` as received: its valid pairs
/// ([`parse_job_shares`]) normalised to add up to 1, with at most 6 decimals; `None` (the row's
/// job takes the whole sample) when no pair is valid or every share is 0.
pub fn canonical_job_shares(text: &str) -> Option<String> {
    let pairs = parse_job_shares(text);
    let total: f64 = pairs.iter().map(|(_, s)| s).sum();
    if !(total > 0.0) {
        return None;
    }
    let out: Vec<String> = pairs
        .iter()
        .map(|(id, s)| {
            let share = format!("{:.6}", s / total);
            format!("{id}={}", share.trim_end_matches('0').trim_end_matches('.'))
        })
        .collect();
    Some(out.join(","))
}

/// Most jobs one sample of a GPU is split between; pairs beyond are left out (a site that
/// time-slices a GPU into more replicas shares it between this many pods at most).
pub const MAX_JOB_SHARES: usize = 64;

/// `(job id, share)` pairs of a [`JOB_SHARES_COLUMN`] text (the first [`MAX_JOB_SHARES`]); pairs that do not parse, or whose
/// share is not a number in 0..=1, are left out.
pub fn parse_job_shares(text: &str) -> Vec<(&str, f64)> {
    text.split(',')
        .take(MAX_JOB_SHARES)
        .filter_map(|pair| {
            let (id, share) = pair.split_once('=')?;
            let share: f64 = share.parse().ok()?;
            (!id.is_empty() && (0.0..=1.0).contains(&share)).then_some((id, share))
        })
        .collect()
}

/// The last column of `gpu_metrics`: for a row written by Prometheus remote write, the labels of
/// its series that differ from the dcgm-exporter labels its label columns give
/// (`ingest::remote_write::dcgm_label_set`), as a JSON object (`{"instance":"…","job":"…"}`,
/// names sorted), an empty value standing for a label the series did not have; null for rows
/// written over OTLP. PromQL reads a row's series back from the two. Text rather than a map, so
/// `SELECT *` works over the Postgres wire protocol too.
pub const GPU_LABELS_COLUMN: &str = "series_labels";

/// The `labels` column of `metrics` and `alerts`: a map of text to text.
fn labels_type() -> DataType {
    let entries = Field::new(
        "entries",
        DataType::Struct(
            vec![
                Field::new("keys", DataType::Utf8, false),
                Field::new("values", DataType::Utf8, true),
            ]
            .into(),
        ),
        false,
    );
    DataType::Map(Arc::new(entries), false)
}

static METRICS: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("time", time_type(), false),
        Field::new("metric", DataType::Utf8, false),
        Field::new("value", DataType::Float64, true),
        Field::new("labels", labels_type(), true),
    ]))
});

/// OTLP metric of a process's GPU memory: `gpu_processes.used_memory_bytes`.
pub const PROCESS_MEMORY_METRIC: &str = "gpu.process.memory.usage";
/// OTLP metric of a process's SM utilisation: `gpu_processes.sm_utilization`.
pub const PROCESS_SM_METRIC: &str = "gpu.process.sm.utilization";
/// OTLP metric of a GPU event: one `gpu_events` row, the value is `code`.
pub const EVENT_METRIC: &str = "gpu.event";

static GPU_PROCESSES: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("time", time_type(), false),
        Field::new("host", DataType::Utf8, false),
        Field::new("gpu_uuid", DataType::Utf8, false),
        Field::new("pid", DataType::Int64, false),
        Field::new("process_name", DataType::Utf8, true),
        Field::new("job_id", DataType::Utf8, true),
        Field::new("job_user", DataType::Utf8, true),
        Field::new("used_memory_bytes", DataType::Int64, true),
        Field::new("sm_utilization", DataType::Float64, true),
    ]))
});

static GPU_EVENTS: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("time", time_type(), false),
        Field::new("host", DataType::Utf8, false),
        Field::new("gpu_uuid", DataType::Utf8, false),
        Field::new("kind", DataType::Utf8, false),
        Field::new("code", DataType::Int64, true),
        Field::new("detail", DataType::Utf8, true),
    ]))
});

static ALERTS: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("time", time_type(), false),
        Field::new("rule", DataType::Utf8, false),
        Field::new("state", DataType::Utf8, false),
        Field::new("labels", labels_type(), true),
        Field::new("value", DataType::Float64, true),
        Field::new("fingerprint", DataType::Utf8, false),
    ]))
});

/// Rollup columns of one value column: `<col>_min`, `<col>_max`, `<col>_avg`, `<col>_last`.
pub const ROLLUP_SUFFIXES: [&str; 4] = ["min", "max", "avg", "last"];

/// The value columns of `gpu_processes`, after its label columns (`host` … `job_user`).
pub const PROCESS_VALUE_COLUMNS: [(&str, ValueType); 2] = [
    ("used_memory_bytes", ValueType::Int),
    ("sm_utilization", ValueType::Float),
];

/// The NVML clock-event reason bits (`clock_event_reasons`) whose samples the `gpu_metrics`
/// rollups count, one column each ([`clock_reason_column`]): a share of samples per reason stays
/// exact over any rollup, where the bucket's largest bitmask hides the reasons seen beside it.
pub const CLOCK_REASON_BITS: [i64; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

/// The raw column whose bits [`CLOCK_REASON_BITS`] count.
pub const CLOCK_REASON_SOURCE: &str = "clock_event_reasons";

/// The rollup column counting the samples whose `clock_event_reasons` has `bit` set.
pub fn clock_reason_column(bit: i64) -> String {
    format!("clock_event_reasons_{bit}_samples")
}

/// How a table's rows are rolled up: its schema is `time`, then `labels` label columns (the
/// groups), then the value columns `values` (aggregated); `seen` adds the group's first and
/// last raw `time` (`first_seen`, `last_seen`) and each value column's count of values
/// (`<col>_count`, so that means over several groups are exact), for tables whose rows come and
/// go (processes); `reasons` ends the schema with the per-bit counts of [`CLOCK_REASON_BITS`].
#[derive(Debug, Clone)]
pub struct RollupSpec {
    /// Label columns after `time`.
    pub labels: usize,
    /// Value columns after the labels, with their types.
    pub values: Vec<(&'static str, ValueType)>,
    /// Whether the rollup keeps each group's first and last raw time and its values' counts.
    pub seen: bool,
    /// Whether the rollup ends with the clock-event reasons' per-bit sample counts.
    pub reasons: bool,
}

impl RollupSpec {
    /// How `source` (a table with rollups) is rolled up.
    pub fn of(source: Table) -> Option<RollupSpec> {
        match source {
            Table::GpuMetrics => Some(RollupSpec {
                labels: LABEL_COLUMNS.len(),
                values: VALUE_COLUMNS.iter().map(|c| (c.column, c.ty)).collect(),
                seen: false,
                reasons: true,
            }),
            Table::GpuProcesses => Some(RollupSpec {
                labels: GPU_PROCESSES.fields().len() - 1 - PROCESS_VALUE_COLUMNS.len(),
                values: PROCESS_VALUE_COLUMNS.to_vec(),
                seen: true,
                reasons: false,
            }),
            _ => None,
        }
    }
}

fn rollup_schema(source: Table) -> SchemaRef {
    let raw = source.schema();
    let spec = RollupSpec::of(source).unwrap_or(RollupSpec {
        labels: 0,
        values: Vec::new(),
        seen: false,
        reasons: false,
    });
    let mut fields: Vec<Field> = raw.fields()[..=spec.labels]
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("samples", DataType::Int64, false));
    if spec.seen {
        fields.push(Field::new("first_seen", time_type(), false));
        fields.push(Field::new("last_seen", time_type(), false));
    }
    for (column, ty) in &spec.values {
        let ty = match ty {
            ValueType::Float => DataType::Float64,
            ValueType::Int => DataType::Int64,
        };
        for suffix in ROLLUP_SUFFIXES {
            let t = if suffix == "avg" {
                DataType::Float64
            } else {
                ty.clone()
            };
            fields.push(Field::new(format!("{column}_{suffix}"), t, true));
        }
        if spec.seen {
            fields.push(Field::new(
                format!("{column}_count"),
                DataType::Int64,
                false,
            ));
        }
    }
    if spec.reasons {
        for bit in CLOCK_REASON_BITS {
            fields.push(Field::new(clock_reason_column(bit), DataType::Int64, true));
        }
    }
    Arc::new(Schema::new(fields))
}

static GPU_METRICS_ROLLUP: LazyLock<SchemaRef> = LazyLock::new(|| rollup_schema(Table::GpuMetrics));
static GPU_PROCESSES_ROLLUP: LazyLock<SchemaRef> =
    LazyLock::new(|| rollup_schema(Table::GpuProcesses));

/// The tables the store keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// One row per GPU per sample.
    GpuMetrics,
    /// Every other metric received.
    Metrics,
    /// `gpu_metrics` rolled up per minute (built when an hour is compacted).
    GpuMetrics1m,
    /// `gpu_metrics` rolled up per hour (built when an hour is compacted).
    GpuMetrics1h,
    /// `gpu_metrics_1h` rolled up per UTC day (built once a day's hours are rolled up).
    GpuMetrics1d,
    /// One row per GPU process per sample.
    GpuProcesses,
    /// `gpu_processes` rolled up per minute (built when an hour is compacted).
    GpuProcesses1m,
    /// `gpu_processes` rolled up per hour (built when an hour is compacted).
    GpuProcesses1h,
    /// One row per GPU event (XID, ECC).
    GpuEvents,
    /// Alert history: one row per state transition.
    Alerts,
    /// The `jobs` view's sums per job, GPU and closed hour, written by the cost accounting
    /// when an hour closes ([`declare_job_ledger`]).
    JobLedger,
    /// `job_ledger`'s usage rows summed per job, GPU and UTC day (with the same columns),
    /// written by the cost accounting once a day's hours are all folded.
    JobLedger1d,
    /// Each job's whole sums per host and GPU model (with the same columns), in the file of
    /// the day the job was last seen, written by the cost accounting a day after that day.
    JobLedgerTotals,
    /// `job_ledger_1d`'s rows summed per UTC day, account, user and GPU model (with the same
    /// columns), written by the cost accounting with each day's sums.
    JobLedgerSpend,
}

impl Table {
    /// Every table, in a fixed order.
    pub const ALL: [Table; 14] = [
        Table::GpuMetrics,
        Table::Metrics,
        Table::GpuMetrics1m,
        Table::GpuMetrics1h,
        Table::GpuProcesses,
        Table::GpuProcesses1m,
        Table::GpuProcesses1h,
        Table::GpuEvents,
        Table::Alerts,
        Table::JobLedger,
        Table::JobLedger1d,
        Table::GpuMetrics1d,
        Table::JobLedgerTotals,
        Table::JobLedgerSpend,
    ];

    /// The bucket width of a rollup table (ns), `None` for tables written by ingest.
    pub fn rollup_nanos(self) -> Option<i64> {
        match self {
            Table::GpuMetrics1m | Table::GpuProcesses1m => Some(60_000_000_000),
            Table::GpuMetrics1h | Table::GpuProcesses1h => Some(3_600_000_000_000),
            Table::GpuMetrics1d => Some(86_400_000_000_000),
            _ => None,
        }
    }

    /// The daily rollup maintenance builds of this hourly rollup, a closed UTC day at a time.
    pub fn daily(self) -> Option<Table> {
        match self {
            Table::GpuMetrics1h => Some(Table::GpuMetrics1d),
            _ => None,
        }
    }

    /// The table whose rows a rollup summarises: the raw table of a rollup the compactor
    /// builds, the hourly rollup of a daily one.
    pub fn summarises(self) -> Option<Table> {
        Table::ALL
            .into_iter()
            .find(|t| t.rollups().contains(&self) || t.daily() == Some(self))
    }

    /// The rollups the compactor builds of a closed hour of this table.
    pub fn rollups(self) -> &'static [Table] {
        match self {
            Table::GpuMetrics => &[Table::GpuMetrics1m, Table::GpuMetrics1h],
            Table::GpuProcesses => &[Table::GpuProcesses1m, Table::GpuProcesses1h],
            _ => &[],
        }
    }

    /// The table a rollup is built from.
    pub fn rollup_source(self) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.rollups().contains(&self))
    }

    /// SQL name.
    pub fn name(self) -> &'static str {
        match self {
            Table::GpuMetrics => "gpu_metrics",
            Table::Metrics => "metrics",
            Table::GpuMetrics1m => "gpu_metrics_1m",
            Table::GpuMetrics1h => "gpu_metrics_1h",
            Table::GpuMetrics1d => "gpu_metrics_1d",
            Table::GpuProcesses => "gpu_processes",
            Table::GpuProcesses1m => "gpu_processes_1m",
            Table::GpuProcesses1h => "gpu_processes_1h",
            Table::GpuEvents => "gpu_events",
            Table::Alerts => "alerts",
            Table::JobLedger => "job_ledger",
            Table::JobLedger1d => "job_ledger_1d",
            Table::JobLedgerTotals => "job_ledger_totals",
            Table::JobLedgerSpend => "job_ledger_spend",
        }
    }

    /// True for the tables that ingest writes (the others are built by compaction, or by the
    /// job ledger one file per hour: [`crate::Store::replace_hour`]).
    pub fn is_ingested(self) -> bool {
        self.rollup_nanos().is_none() && !self.is_ledger()
    }

    /// True for the job ledger's tables (written by the cost accounting, with its columns).
    pub fn is_ledger(self) -> bool {
        matches!(
            self,
            Table::JobLedger | Table::JobLedger1d | Table::JobLedgerTotals | Table::JobLedgerSpend
        )
    }

    /// Table by SQL name.
    pub fn from_name(name: &str) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.name() == name)
    }

    /// A stable one-byte id, used in the WAL.
    pub fn id(self) -> u8 {
        match self {
            Table::GpuMetrics => 1,
            Table::Metrics => 2,
            Table::GpuMetrics1m => 3,
            Table::GpuMetrics1h => 4,
            Table::GpuProcesses => 5,
            Table::GpuEvents => 6,
            Table::Alerts => 7,
            Table::JobLedger => 8,
            Table::GpuProcesses1m => 9,
            Table::GpuProcesses1h => 10,
            Table::JobLedger1d => 11,
            Table::GpuMetrics1d => 12,
            Table::JobLedgerTotals => 13,
            Table::JobLedgerSpend => 14,
        }
    }

    /// Table by WAL id.
    pub fn from_id(id: u8) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.id() == id)
    }

    /// Arrow schema.
    pub fn schema(self) -> SchemaRef {
        match self {
            Table::GpuMetrics => GPU_METRICS.clone(),
            Table::Metrics => METRICS.clone(),
            Table::GpuMetrics1m | Table::GpuMetrics1h | Table::GpuMetrics1d => {
                GPU_METRICS_ROLLUP.clone()
            }
            Table::GpuProcesses => GPU_PROCESSES.clone(),
            Table::GpuProcesses1m | Table::GpuProcesses1h => GPU_PROCESSES_ROLLUP.clone(),
            Table::GpuEvents => GPU_EVENTS.clone(),
            Table::Alerts => ALERTS.clone(),
            Table::JobLedger
            | Table::JobLedger1d
            | Table::JobLedgerTotals
            | Table::JobLedgerSpend => ledger::job_ledger_schema(),
        }
    }

    /// Columns the persisted files are sorted by (the last is always `time`).
    pub fn sort_columns(self) -> &'static [&'static str] {
        match self {
            Table::GpuMetrics
            | Table::GpuMetrics1m
            | Table::GpuMetrics1h
            | Table::GpuMetrics1d
            | Table::GpuProcesses
            | Table::GpuProcesses1m
            | Table::GpuProcesses1h
            | Table::GpuEvents => &["host", "gpu_uuid", "time"],
            Table::Metrics => &["metric", "time"],
            Table::Alerts => &["rule", "time"],
            Table::JobLedger
            | Table::JobLedger1d
            | Table::JobLedgerTotals
            | Table::JobLedgerSpend => &["job_id", "host", "gpu_uuid", "time"],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_and_match_the_interface() {
        let schema = Table::GpuMetrics.schema();
        let names: HashSet<_> = schema.fields().iter().map(|f| f.name().clone()).collect();
        assert_eq!(names.len(), schema.fields().len());
        let otlp: HashSet<_> = VALUE_COLUMNS.iter().map(|c| c.otlp).collect();
        assert_eq!(otlp.len(), VALUE_COLUMNS.len());
        for col in [
            "time",
            "host",
            "gpu_uuid",
            "gpu_index",
            "gpu_model",
            "mig_instance",
            "job_id",
            "job_user",
            "job_name",
            "scheduler",
            "k8s_namespace",
            "k8s_pod",
            "k8s_container",
            "gpu_utilization",
            "memory_utilization",
            "sm_active",
            "sm_occupancy",
            "tensor_active",
            "dram_active",
            "fp64_active",
            "fp32_active",
            "fp16_active",
            "memory_used_bytes",
            "memory_total_bytes",
            "power_watts",
            "energy_joules",
            "temperature_celsius",
            "memory_temperature_celsius",
            "sm_clock_mhz",
            "memory_clock_mhz",
            "clock_event_reasons",
            "pcie_tx_bytes_per_second",
            "pcie_rx_bytes_per_second",
            "nvlink_tx_bytes_per_second",
            "nvlink_rx_bytes_per_second",
            "ecc_sbe_volatile_total",
            "ecc_dbe_volatile_total",
            "remapped_rows_uncorrectable",
            "remapped_rows_failure",
            "xid_errors_total",
            "sm_clock_max_mhz",
            "pcie_link_gen",
            "pcie_link_width",
            "gr_engine_active",
            "series_labels",
            "job_account",
            "job_partition",
            "job_qos",
            "job_array_id",
            "job_array_task_id",
            "job_time_limit_seconds",
            "job_labels",
            "job_shares",
        ] {
            assert!(names.contains(col), "missing column {col}");
        }
        assert_eq!(names.len(), 53);
        let rollup = Table::GpuMetrics1h.schema();
        for col in ["job_account", "job_labels"] {
            assert!(rollup.field_with_name(col).is_ok(), "rollup lacks {col}");
        }
        // A share changes every sample: not a rollup label.
        assert!(rollup.field_with_name("job_shares").is_err());
        assert_eq!(
            rollup
                .field_with_name("job_time_limit_seconds")
                .map(|f| f.data_type().clone())
                .ok(),
            Some(DataType::Int64)
        );
    }

    #[test]
    fn job_shares_parse_and_bad_pairs_are_left_out() {
        assert_eq!(
            parse_job_shares("a=0.75,ns/b=0.25"),
            [("a", 0.75), ("ns/b", 0.25)]
        );
        assert_eq!(
            parse_job_shares("x=1.5,y=-0.1,=0.5,z,w=nan,a=b=0.5,v=0.5"),
            [("v", 0.5)]
        );
        assert!(parse_job_shares("").is_empty());
        assert_eq!(
            canonical_job_shares("a=0.6,junk,b=0.2").as_deref(),
            Some("a=0.75,b=0.25")
        );
        assert_eq!(canonical_job_shares("a=0,b=0"), None);
        assert_eq!(canonical_job_shares("nothing"), None);
    }

    #[test]
    fn job_labels_text_is_sorted_and_splits_back() {
        assert_eq!(job_labels_text(Vec::new()), None);
        let pairs = vec![
            ("team".to_string(), "vision".to_string()),
            ("project".to_string(), "a,b=c".to_string()),
            ("team".to_string(), "other".to_string()),
        ];
        assert_eq!(
            job_labels_text(pairs).as_deref(),
            Some("project=a_b_c,team=other")
        );
    }

    #[test]
    fn schema_doc_lists_every_wire_name() {
        let doc = include_str!("../../docs/schema.md");
        for c in VALUE_COLUMNS {
            let row = format!(
                "| `{}` | {} | `{}` |",
                c.column,
                match c.ty {
                    ValueType::Float => "Float64",
                    ValueType::Int => "Int64",
                },
                c.otlp
            );
            assert!(
                doc.contains(&row),
                "docs/schema.md lacks the row for {}",
                c.column
            );
        }
        for (col, attrs) in LABEL_COLUMNS {
            assert!(
                doc.contains(&format!("| `{col}` |")),
                "docs/schema.md lacks label {col}"
            );
            assert!(
                doc.contains(&format!("`{}`", attrs[0])),
                "docs/schema.md lacks {}",
                attrs[0]
            );
        }
    }
}
