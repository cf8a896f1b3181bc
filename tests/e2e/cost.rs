//! Monthly statements (`gpuwatch cost`, `GET /api/v1/cost`) against samples sent over
//! OTLP/HTTP by two accounts' jobs: every figure to the cent and below against a hand
//! computation, the totals equal to the `jobs` view, the same rows in CSV, JSON and Parquet,
//! and bad groupings or months refused with 400.

use std::process::Command;

use gpuwatch_e2e::{TestServer, bin_dir};

use crate::{now_ns, rows};

const S: i64 = 1_000_000_000;

/// One sample of `gpu` (job `job` of `account`, pod label `team`) as the agent sends it.
fn sample(
    t: i64,
    gpu: &str,
    model: &str,
    job: &str,
    account: &str,
    team: &str,
    joules: f64,
) -> serde_json::Value {
    let attrs = serde_json::json!([
        {"key": "hw.id", "value": {"stringValue": gpu}},
        {"key": "hw.model", "value": {"stringValue": model}},
        {"key": "job.id", "value": {"stringValue": job}},
        {"key": "job.user", "value": {"stringValue": "alice"}},
        {"key": "job.account", "value": {"stringValue": account}},
        {"key": "k8s.pod.label.team", "value": {"stringValue": team}},
    ]);
    let point = |v: f64| serde_json::json!({"timeUnixNano": t.to_string(), "attributes": attrs, "asDouble": v});
    serde_json::json!({"resourceMetrics": [{
        "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "e2e-node"}}]},
        "scopeMetrics": [{"metrics": [
            {"name": "hw.gpu.utilization", "gauge": {"dataPoints": [point(0.9)]}},
            {"name": "hw.energy", "gauge": {"dataPoints": [point(joules)]}}
        ]}]
    }]})
}

/// The month (`YYYY-MM`, UTC) of `t` nanoseconds.
fn month_of(t: i64) -> String {
    chrono::DateTime::from_timestamp_nanos(t)
        .format("%Y-%m")
        .to_string()
}

fn cli(server: &TestServer, args: &[&str]) -> Vec<u8> {
    let out = Command::new(bin_dir().join("gpuwatch"))
        .arg("cost")
        .args(args)
        .args(["--server", &server.url()])
        .output()
        .expect("gpuwatch cost");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn monthly_statements_equal_a_hand_computation_in_every_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = crate::with_config(
        dir.path(),
        "[cost]\ngpu_hour_usd = [{ model = \"*H100*\", usd = 2.5 }, { model = \"*A100*\", usd = 1.2 }]\nkwh_usd = 0.12\npue = 1.3\n",
    )
    .start();
    // Two jobs, 100 s each, sampled every 10 s, within one month.
    let mut end = now_ns() - 60 * S;
    if month_of(end - 100 * S) != month_of(end) {
        end -= 200 * S;
    }
    let month = month_of(end);
    let client = reqwest::Client::new();
    for k in 0..=10i64 {
        let t = end - 100 * S + k * 10 * S;
        for body in [
            sample(
                t,
                "GPU-p",
                "NVIDIA H100 80GB HBM3",
                "p-1",
                "physics",
                "vision",
                1000.0 * k as f64,
            ),
            sample(
                t,
                "GPU-c",
                "NVIDIA A100-SXM4-40GB",
                "c-1",
                "chem",
                "nlp",
                500.0 * k as f64,
            ),
        ] {
            let resp = client
                .post(format!("{}/v1/metrics", server.url()))
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .expect("otlp");
            assert_eq!(resp.status().as_u16(), 200);
        }
    }
    // By hand: 100 s each; physics 10,000 J at 2.50 USD/h, chem 5,000 J at 1.20 USD/h.
    let usd_per_j = 0.12 * 1.3 / 3.6e6;
    let physics = 100.0 * 2.5 / 3600.0 + 10_000.0 * usd_per_j;
    let chem = 100.0 * 1.2 / 3600.0 + 5_000.0 * usd_per_j;

    let json: Vec<serde_json::Value> =
        serde_json::from_slice(&cli(&server, &["--month", &month, "--format", "json"]))
            .expect("json");
    assert_eq!(json.len(), 2, "{json:?}");
    let (p, c) = (&json[0], &json[1]);
    assert_eq!(
        (p["account"].as_str(), c["account"].as_str()),
        (Some("physics"), Some("chem"))
    );
    assert_eq!(p["month"].as_str(), Some(month.as_str()));
    assert_eq!(p["jobs"], 1);
    let f = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k}: {r}"));
    assert!(close(f(p, "cost_usd"), physics), "{p}");
    assert!(close(f(c, "cost_usd"), chem), "{c}");
    assert!(close(f(p, "gpu_hours"), 100.0 / 3600.0));
    assert!(close(f(p, "energy_kwh"), 10_000.0 / 3.6e6));
    assert_eq!(f(p, "idle_gpu_hours"), 0.0);
    // The statement adds up to the jobs view.
    let jobs = rows(&server, "SELECT sum(cost_usd) AS c FROM jobs").await;
    assert!(close(f(&jobs[0], "c"), physics + chem), "{jobs:?}");

    // CSV: the same rows.
    let csv =
        String::from_utf8(cli(&server, &["--month", &month, "--format", "csv"])).expect("utf-8");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    assert_eq!(&header[..4], ["month", "account", "gpu_model", "jobs"]);
    let cost_at = header
        .iter()
        .position(|h| *h == "cost_usd")
        .expect("cost_usd");
    let costs: Vec<f64> = lines
        .map(|l| {
            l.split(',')
                .nth(cost_at)
                .and_then(|v| v.parse().ok())
                .expect("cost")
        })
        .collect();
    assert!(
        costs.len() == 2 && close(costs[0], physics) && close(costs[1], chem),
        "{csv}"
    );

    // Parquet, read back.
    let parquet = cli(&server, &["--month", &month, "--format", "parquet"]);
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(
        bytes::Bytes::from(parquet),
        1024,
    )
    .expect("parquet");
    let mut total = 0.0;
    for b in reader {
        let b = b.expect("batch");
        let c = b.column_by_name("cost_usd").expect("cost_usd");
        let c = arrow::array::AsArray::as_primitive::<arrow::datatypes::Float64Type>(c);
        total += c.iter().flatten().sum::<f64>();
    }
    assert!(close(total, physics + chem));

    // The table ends with the totals; a pod label groups too.
    let table = String::from_utf8(cli(&server, &["--month", &month])).expect("utf-8");
    assert!(
        table.contains("physics") && table.contains(&format!("{:.2} USD", physics + chem)),
        "{table}"
    );
    let teams: Vec<serde_json::Value> = serde_json::from_slice(&cli(
        &server,
        &["--by", "label:team", "--month", &month, "--format", "json"],
    ))
    .expect("json");
    assert_eq!(teams[0]["label:team"], "vision");

    // Bad input: 400 naming what to send.
    for (q, says) in [
        ("by=bogus", "group by account"),
        ("by=label:a'b", "pod label name"),
        ("month=2026-13", "YYYY-MM"),
        ("mnth=2026-11", "malformed query string"),
        ("format=xml", "format"),
    ] {
        let resp = client
            .get(format!("{}/api/v1/cost?{q}", server.url()))
            .send()
            .await
            .expect("get");
        assert_eq!(resp.status().as_u16(), 400, "{q}");
        let body = resp.text().await.expect("body");
        assert!(body.contains(says), "{q}: {body}");
    }
    let out = Command::new(bin_dir().join("gpuwatch"))
        .args(["cost", "--month", "soon", "--server", &server.url()])
        .output()
        .expect("gpuwatch cost");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("YYYY-MM"));
}
