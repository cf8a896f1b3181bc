//! The job's GPU processes: its raw `gpu_processes` rows, and for the hours retention took them
//! from, the hourly rollup (`gpu_processes_1h`), so a year-old job's report still lists them with
//! the same figures (first and last seen, memory peak and mean SM share come out of the rollup as
//! from the raw rows).

use gpuwatch_query::{QueryEngine, Result as QueryResult};
use serde::{Deserialize, Serialize};

use super::{f, i, rfc3339, rows, s};
use crate::cost::sql_str;

/// The most processes a report lists (the rest are counted in `processes_left_out`).
pub const MAX_PROCESSES: usize = 200;

/// One process of the job on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobProcess {
    /// Host.
    pub host: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// Process id.
    pub pid: i64,
    /// Its executable name, when the agent could read it.
    pub name: Option<String>,
    /// First seen, RFC 3339.
    pub first_seen: String,
    /// Last seen, RFC 3339.
    pub last_seen: String,
    /// Peak GPU memory, bytes.
    pub memory_peak_bytes: Option<i64>,
    /// Mean share (0..1) of the GPU's SM time the process used, over its samples with one.
    pub sm_share: Option<f64>,
}

/// The SQL of `job_id`'s processes: raw rows, plus hourly rollups of the hours before the oldest
/// raw row (retention removes raw rows a whole hour at a time, and only once rolled up).
fn processes_sql(job_id: &str) -> String {
    let job = sql_str(job_id);
    format!(
        "SELECT host, gpu_uuid, pid, max(process_name) AS name, \
         CAST(min(first_seen) AS BIGINT) AS first_ns, CAST(max(last_seen) AS BIGINT) AS last_ns, \
         max(mem) AS memory_peak, sum(sm_s) / nullif(sum(sm_n), 0) AS sm_share \
         FROM ( \
           SELECT host, gpu_uuid, pid, process_name, time AS first_seen, time AS last_seen, \
             used_memory_bytes AS mem, sm_utilization AS sm_s, \
             CASE WHEN sm_utilization IS NULL THEN 0 ELSE 1 END AS sm_n \
           FROM gpu_processes WHERE job_id = {job} \
           UNION ALL \
           SELECT host, gpu_uuid, pid, process_name, first_seen, last_seen, \
             used_memory_bytes_max AS mem, sm_utilization_avg * sm_utilization_count AS sm_s, \
             sm_utilization_count AS sm_n \
           FROM gpu_processes_1h WHERE job_id = {job} AND time < ( \
             SELECT coalesce(date_trunc('hour', min(time)), to_timestamp_seconds(9000000000)) \
             FROM gpu_processes) \
         ) p GROUP BY host, gpu_uuid, pid ORDER BY host, gpu_uuid, pid LIMIT {}",
        MAX_PROCESSES + 1
    )
}

/// `job_id`'s processes (at most [`MAX_PROCESSES`]), and whether more were left out.
pub(super) async fn job_processes(
    engine: &QueryEngine,
    job_id: &str,
) -> QueryResult<(Vec<JobProcess>, bool)> {
    let mut out: Vec<JobProcess> = rows(engine, &processes_sql(job_id))
        .await?
        .iter()
        .map(|r| JobProcess {
            host: s(r, "host").unwrap_or_default(),
            gpu_uuid: s(r, "gpu_uuid").unwrap_or_default(),
            pid: i(r, "pid").unwrap_or_default(),
            name: s(r, "name"),
            first_seen: rfc3339(i(r, "first_ns").unwrap_or_default()),
            last_seen: rfc3339(i(r, "last_ns").unwrap_or_default()),
            memory_peak_bytes: i(r, "memory_peak"),
            sm_share: f(r, "sm_share"),
        })
        .collect();
    let more = out.len() > MAX_PROCESSES;
    out.truncate(MAX_PROCESSES);
    Ok((out, more))
}
