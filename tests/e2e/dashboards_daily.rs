//! Dashboards over histories built by `gpuwatch-bench history` (hourly rollups and the job
//! ledger written through the store, the daily rollups rolled by the store's own maintenance):
//! on 40 days of four GPUs, every panel target that reads `gpu_metrics_1d` answers over 35 and
//! 39 days as it does from the hourly rollups alone (`grafana_sql.py paths`: the same SQL with
//! the daily branches off), every target that reads the hourly rollups over 2 days answers over
//! 3 and 7 days as from the 1-minute ones (`grafana_sql.py hours`), and the Job dashboard's job
//! picker, which reads the last 7 days first, as over the whole range (`grafana_sql.py recent`);
//! on 60 hosts, the Fleet panels draw at most 50 hosts or 100 GPUs (`grafana_sql.py series`).

use std::process::Command;

use gpuwatch_e2e::TestServer;

use crate::dashboards::{dashboards, dsn, panels, repo};
use crate::limiter::bench;

/// The condition of the hourly branch of the Fleet and Health panels over 2 days, as the
/// dashboards write it (`grafana_sql.py`'s `HOURLY_FROM`).
const HOURLY_BRANCH: &str = "> 172800 AND ($__unixEpochTo()";

/// A history built by `gpuwatch-bench history --build-only` with `hosts`, `gpus` a host, `days`
/// and the last `minute_days` of them in 1-minute rollups, and a server on it.
fn history(
    dir: &std::path::Path,
    (hosts, gpus): (&str, &str),
    (days, minute_days): (&str, &str),
) -> TestServer {
    let data = dir.join("data");
    let out = Command::new(bench())
        .current_dir(repo())
        .args([
            "history",
            "--hosts",
            hosts,
            "--gpus-per-host",
            gpus,
            "--days",
            days,
        ])
        .args([
            "--minute-days",
            minute_days,
            "--raw-hours",
            "2",
            "--build-only",
        ])
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
    TestServer::builder().data_dir(&data).start()
}

/// `grafana_sql.py SUBCOMMAND` against `server` with `args`.
fn grafana_sql(server: &TestServer, subcommand: &str, args: &[&str]) -> String {
    crate::dashboards::grafana_sql(&dsn(server.pg), subcommand, args)
}

#[test]
fn panels_over_daily_rollups_answer_as_over_hourly_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = history(dir.path(), ("2", "2"), ("40", "8"));
    let days = server.psql(
        None,
        "disable",
        &[
            "-c",
            "SELECT count(DISTINCT time), count(DISTINCT gpu_uuid) FROM gpu_metrics_1d",
        ],
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
    let text = grafana_sql(&server, "paths", &["--range", "35d", "--range", "39d"]);
    // Every target with a daily branch, over both ranges.
    let targets = targets_reading("gpu_metrics_1d");
    assert!(targets >= 10, "{targets} targets read gpu_metrics_1d");
    assert!(
        text.contains(&format!(
            "{} panel queries compared, 0 failures",
            2 * targets
        )),
        "{text}"
    );
    hourly_answers_as_minutes(&server);
    // The job picker reads the range's last 7 days first and the rest only when they hold fewer
    // jobs than it lists: over 39 days it answers as over the whole range at once, both when
    // the window alone answers (a limit of 20) and when the rest is read (its own 1,000).
    let text = grafana_sql(&server, "recent", &["--range", "39d"]);
    assert!(
        text.contains("2 panel queries checked, 0 failures"),
        "{text}"
    );
    assert!(
        text.contains("limit 20: 20 rows, 20 from the window alone"),
        "{text}"
    );
    let rest = text
        .lines()
        .find_map(|l| l.split_once("limit 1000: "))
        .and_then(|(_, counts)| counts.split_once(" rows, "))
        .and_then(|(all, alone)| {
            let alone = alone.split_once(' ')?.0;
            Some((all.parse::<usize>().ok()?, alone.parse::<usize>().ok()?))
        });
    assert!(
        matches!(rest, Some((all, alone)) if all > alone && alone >= 20),
        "{text}"
    );
}

/// How many panel targets of the dashboards hold `text` in their SQL.
fn targets_reading(text: &str) -> usize {
    dashboards()
        .iter()
        .flat_map(|(_, d)| panels(d))
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter(|t| t["rawSql"].as_str().unwrap_or("").contains(text))
        .count()
}

/// Over 2 days the Fleet and Health panels read the hourly rollups, in buckets of at least an
/// hour: over 3 and 7 days ending on an hour they answer as from the 1-minute rollups.
fn hourly_answers_as_minutes(server: &TestServer) {
    let hour = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        / 3600
        * 3600;
    let to = hour.to_string();
    let text = grafana_sql(
        server,
        "hours",
        &["--range", "3d", "--range", "7d", "--to", &to],
    );
    let hourly = targets_reading(HOURLY_BRANCH);
    assert!(
        hourly >= 10,
        "{hourly} targets read hourly rollups over 2 days"
    );
    assert!(
        text.contains(&format!(
            "{} panel queries compared, 0 failures",
            2 * hourly
        )),
        "{text}"
    );
}

/// On 60 hosts of two GPUs, the per-host panels draw 50 hosts and the per-GPU heatmap 100
/// GPUs, the ones their ranking picks from every series the range has.
#[test]
fn fleet_panels_draw_at_most_fifty_hosts_or_a_hundred_gpus() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = history(dir.path(), ("60", "2"), ("2", "1"));
    let text = grafana_sql(&server, "series", &["--range", "24h"]);
    assert!(
        text.contains("7 panel queries checked, 0 failures"),
        "{text}"
    );
    assert!(
        text.contains("Utilisation per GPU [24h]: 100 of 120 series"),
        "{text}"
    );
    assert!(
        text.contains("GPU utilisation by host [24h]: 50 of 60 series"),
        "{text}"
    );
}
