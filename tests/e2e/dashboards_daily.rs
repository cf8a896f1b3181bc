//! The dashboards' daily rollups: on a 40-day history of four GPUs built by `gpuwatch-bench
//! history` (hourly rollups and the job ledger written through the store, the daily rollups
//! rolled by the store's own maintenance), every panel target that reads `gpu_metrics_1d`
//! answers over 35 and 39 days exactly as it does from the hourly rollups alone
//! (`grafana_sql.py paths`: the same SQL with the daily branch off).

use std::process::Command;

use gpuwatch_e2e::TestServer;

use crate::dashboards::{repo, script};
use crate::limiter::bench;

#[test]
fn panels_over_daily_rollups_answer_as_over_hourly_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let out = Command::new(bench())
        .current_dir(repo())
        .args(["history", "--hosts", "2", "--gpus-per-host", "2", "--days", "40"])
        .args(["--minute-days", "1", "--raw-hours", "2", "--build-only"])
        .arg("--data-dir")
        .arg(&data)
        .output()
        .expect("gpuwatch-bench history");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let server = TestServer::builder().data_dir(&data).start();
    let days = server.psql(
        None,
        "disable",
        &["-c", "SELECT count(DISTINCT time), count(DISTINCT gpu_uuid) FROM gpu_metrics_1d"],
    );
    // 40 days back from the hour the history was built: 39 or 40 closed UTC days.
    let counts: Vec<i64> = days
        .stdout
        .trim()
        .split('|')
        .filter_map(|v| v.parse().ok())
        .collect();
    assert!(
        counts.len() == 2 && counts[0] >= 39 && counts[1] == 4,
        "daily rollups: {days:?}"
    );
    let dsn = format!(
        "host={} port={} user=grafana dbname=gpuwatch sslmode=disable",
        server.pg.ip(),
        server.pg.port()
    );
    let out = Command::new("python3")
        .arg(script())
        .args(["paths", "--dsn", &dsn, "--range", "35d", "--range", "39d"])
        .arg("--dashboards")
        .arg(repo().join("dashboards"))
        .output()
        .expect("python3 (bash .ci/run installs psycopg)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every target with a daily branch, over both ranges.
    let targets = std::fs::read_dir(repo().join("dashboards"))
        .expect("dashboards/")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .map(|t| t.matches("FROM gpu_metrics_1d").count())
        .sum::<usize>();
    assert!(targets >= 10, "{targets} targets read gpu_metrics_1d");
    assert!(
        text.contains(&format!("{} panel queries compared, 0 failures", 2 * targets)),
        "{text}"
    );
}
