use super::*;
use prost::Message;

/// A request with every point readable.
fn json(body: &[u8]) -> Result<ExportMetricsServiceRequest> {
    decode_json(body).map(|(req, rej)| {
        assert_eq!(rej, Rejections::default());
        req
    })
}
use crate::schema::Table;
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Float64Type, Int32Type, Int64Type};

fn json_request() -> &'static str {
    r#"{"resourceMetrics":[{"resource":{"attributes":[{"key":"host.name","value":{"stringValue":"node-1"}}]},
      "scopeMetrics":[{"scope":{"name":"t"},"metrics":[
        {"name":"hw.gpu.utilization","unit":"1","gauge":{"dataPoints":[
          {"timeUnixNano":"1700000000000000000","asDouble":0.5,"attributes":[
            {"key":"hw.id","value":{"stringValue":"GPU-a"}},{"key":"gpu.index","value":{"intValue":"0"}},
            {"key":"job.id","value":{"stringValue":"42"}}]},
          {"timeUnixNano":"1700000000000000000","asDouble":0.25,"attributes":[
            {"key":"hw.id","value":{"stringValue":"GPU-b"}},{"key":"gpu.index","value":{"intValue":"1"}}]}]}},
        {"name":"hw.gpu.memory.usage","unit":"By","gauge":{"dataPoints":[
          {"timeUnixNano":"1700000000000000000","asInt":"1024","attributes":[
            {"key":"hw.id","value":{"stringValue":"GPU-a"}}]}]}},
        {"name":"hw.energy","unit":"J","sum":{"aggregationTemporality":2,"isMonotonic":true,"dataPoints":[
          {"timeUnixNano":"1700000000000000000","asDouble":12.5,"attributes":[
            {"key":"hw.id","value":{"stringValue":"GPU-a"}}]}]}},
        {"name":"queue.depth","gauge":{"dataPoints":[
          {"timeUnixNano":"1700000000000000001","asInt":"7","attributes":[{"key":"q","value":{"stringValue":"x"}}]},
          {"timeUnixNano":"1700000000000000001","asDouble":"NaN"}]}},
        {"name":"latency","histogram":{"dataPoints":[{"timeUnixNano":"1","count":"1"}]}}
      ]}]}]}"#
}

fn process_and_event_request() -> &'static str {
    r#"{"resourceMetrics":[{"resource":{"attributes":[{"key":"host.name","value":{"stringValue":"node-1"}}]},
      "scopeMetrics":[{"metrics":[
        {"name":"gpu.process.memory.usage","unit":"By","gauge":{"dataPoints":[
          {"timeUnixNano":"1700000000000000000","asInt":"2048","attributes":[
            {"key":"hw.id","value":{"stringValue":"GPU-a"}},{"key":"process.pid","value":{"intValue":"4242"}},
            {"key":"process.executable.name","value":{"stringValue":"python3"}},
            {"key":"job.id","value":{"stringValue":"77"}},{"key":"job.user","value":{"stringValue":"alice"}}]},
          {"timeUnixNano":"1700000000000000000","asInt":"512","attributes":[
            {"key":"hw.id","value":{"stringValue":"GPU-a"}},{"key":"process.pid","value":{"intValue":"99"}}]},
          {"timeUnixNano":"1700000000000000000","asInt":"1","attributes":[
            {"key":"hw.id","value":{"stringValue":"GPU-a"}}]}]}},
        {"name":"gpu.process.sm.utilization","unit":"1","gauge":{"dataPoints":[
          {"timeUnixNano":"1700000000000000000","asDouble":0.75,"attributes":[
            {"key":"hw.id","value":{"stringValue":"GPU-a"}},{"key":"process.pid","value":{"intValue":"4242"}}]}]}},
        {"name":"gpu.event","unit":"1","gauge":{"dataPoints":[
          {"timeUnixNano":"1700000000000000005","asInt":"79","attributes":[
            {"key":"hw.id","value":{"stringValue":"GPU-b"}},{"key":"gpu.event.kind","value":{"stringValue":"xid"}},
            {"key":"gpu.event.detail","value":{"stringValue":"xid 79"}}]},
          {"timeUnixNano":"1700000000000000006","asInt":"3","attributes":[
            {"key":"gpu.event.kind","value":{"stringValue":"xid"}}]}]}}
      ]}]}]}"#
}

#[test]
fn process_and_event_points_fill_their_tables() {
    let req = json(process_and_event_request().as_bytes()).expect("valid json");
    let (wb, stats) = to_write_batch(&req, 1_700_000_000_000_000_000).expect("decodes");
    assert_eq!(stats.points, 6);
    assert_eq!(stats.rejected, 0);
    let table = |t: Table| {
        wb.batches
            .iter()
            .find(|(x, _)| *x == t)
            .map(|(_, b)| b.clone())
            .unwrap_or_else(|| panic!("no {} batch", t.name()))
    };
    let p = table(Table::GpuProcesses);
    assert_eq!(p.schema(), Table::GpuProcesses.schema());
    assert_eq!(p.num_rows(), 2, "memory and sm of pid 4242 share one row");
    let col = |b: &RecordBatch, n: &str| b.column_by_name(n).expect(n).clone();
    let pid = col(&p, "pid");
    let pid = pid.as_primitive::<Int64Type>();
    assert_eq!((pid.value(0), pid.value(1)), (4242, 99));
    assert_eq!(col(&p, "host").as_string::<i32>().value(0), "node-1");
    assert_eq!(col(&p, "gpu_uuid").as_string::<i32>().value(0), "GPU-a");
    assert_eq!(
        col(&p, "process_name").as_string::<i32>().value(0),
        "python3"
    );
    assert!(col(&p, "process_name").is_null(1));
    assert_eq!(col(&p, "job_id").as_string::<i32>().value(0), "77");
    assert_eq!(col(&p, "job_user").as_string::<i32>().value(0), "alice");
    let mem = col(&p, "used_memory_bytes");
    assert_eq!(mem.as_primitive::<Int64Type>().value(0), 2048);
    assert_eq!(mem.as_primitive::<Int64Type>().value(1), 512);
    let sm = col(&p, "sm_utilization");
    assert_eq!(sm.as_primitive::<Float64Type>().value(0), 0.75);
    assert!(sm.is_null(1), "pid 99 had no sm point");

    let e = table(Table::GpuEvents);
    assert_eq!(e.schema(), Table::GpuEvents.schema());
    assert_eq!(e.num_rows(), 1);
    assert_eq!(col(&e, "gpu_uuid").as_string::<i32>().value(0), "GPU-b");
    assert_eq!(col(&e, "kind").as_string::<i32>().value(0), "xid");
    assert_eq!(col(&e, "code").as_primitive::<Int64Type>().value(0), 79);
    assert_eq!(col(&e, "detail").as_string::<i32>().value(0), "xid 79");

    // A process point without a pid and an event without a GPU are kept in `metrics`.
    let m = table(Table::Metrics);
    let names = col(&m, "metric");
    let names: Vec<&str> = names.as_string::<i32>().iter().flatten().collect();
    assert_eq!(names, ["gpu.process.memory.usage", "gpu.event"]);
    assert!(wb.batches.iter().all(|(t, _)| *t != Table::GpuMetrics));
}

#[test]
fn pivots_gpu_points_into_rows_and_keeps_the_rest() {
    let req = json(json_request().as_bytes()).expect("valid json");
    let (wb, stats) = to_write_batch(&req, 1_700_000_000_000_000_000).expect("decodes");
    assert_eq!(
        stats,
        DecodeStats {
            points: 6,
            rejected: 1,
            non_finite: 1,
            ..DecodeStats::default()
        }
    );
    let (t, gpu) = &wb.batches[0];
    assert_eq!(*t, Table::GpuMetrics);
    assert_eq!(gpu.num_rows(), 2);
    let col = |n: &str| gpu.column_by_name(n).expect(n).clone();
    let uuid = col("gpu_uuid");
    let uuid = uuid.as_string::<i32>();
    assert_eq!(uuid.value(0), "GPU-a");
    assert_eq!(col("host").as_string::<i32>().value(1), "node-1");
    assert_eq!(col("gpu_index").as_primitive::<Int32Type>().value(1), 1);
    assert_eq!(
        col("gpu_utilization")
            .as_primitive::<Float64Type>()
            .value(0),
        0.5
    );
    assert_eq!(
        col("memory_used_bytes")
            .as_primitive::<Int64Type>()
            .value(0),
        1024
    );
    assert!(
        col("memory_used_bytes").is_null(1),
        "absent value is null, not 0"
    );
    assert_eq!(
        col("energy_joules").as_primitive::<Float64Type>().value(0),
        12.5
    );
    assert_eq!(col("job_id").as_string::<i32>().value(0), "42");
    assert!(col("job_id").is_null(1));
    assert!(col("power_watts").is_null(0));

    let (t, m) = &wb.batches[1];
    assert_eq!(*t, Table::Metrics);
    assert_eq!(m.num_rows(), 2, "queue.depth and latency_count");
    assert_eq!(m.column(2).as_primitive::<Float64Type>().value(0), 7.0);
    let rows = metric_rows(&wb);
    let keys: Vec<_> = rows[0].2.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, vec!["host.name", "q"]);
    assert_eq!(rows[1].0, "latency_count");
}

#[test]
fn protobuf_round_trip_matches_json() {
    let req = json(json_request().as_bytes()).expect("valid json");
    let bytes = req.encode_to_vec();
    let (again, rej) = decode_protobuf(&bytes).expect("valid protobuf");
    assert_eq!(rej, Rejections::default());
    // Compared as bytes: the request holds a NaN, which is not equal to itself.
    assert_eq!(again.encode_to_vec(), bytes);
}

#[test]
fn json_doubles_are_the_exact_values_sent() {
    // Values whose shortest decimal form the default serde_json parser reads one unit in the
    // last place off.
    for v in [
        1002.3515436649323_f64,
        1000.7359268665314,
        0.1 + 0.2,
        123456.78901234567,
    ] {
        let body = format!(
            r#"{{"resourceMetrics":[{{"scopeMetrics":[{{"metrics":[{{"name":"x","gauge":{{"dataPoints":[{{"timeUnixNano":"1","asDouble":{v}}}]}}}}]}}]}}]}}"#
        );
        let req = json(body.as_bytes()).expect("json");
        let (wb, _) = to_write_batch(&req, 99).expect("decodes");
        let got = wb.batches[0]
            .1
            .column(2)
            .as_primitive::<Float64Type>()
            .value(0);
        assert_eq!(got.to_bits(), v.to_bits(), "{v} read as {got}");
    }
}

#[test]
fn garbage_is_a_clear_error() {
    let err = decode_protobuf(b"\xff\xff\xff\xff").expect_err("garbage");
    assert!(
        err.to_string().starts_with("malformed otlp protobuf"),
        "{err}"
    );
    let err = json(b"{\"resourceMetrics\": 3}").expect_err("bad json");
    assert!(err.is_client_error());
}

#[test]
fn missing_time_uses_now() {
    let req = json(br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"x","gauge":{"dataPoints":[{"asDouble":1}]}}]}]}]}"#).expect("json");
    let (wb, _) = to_write_batch(&req, 99).expect("decodes");
    let t = wb.batches[0]
        .1
        .column(0)
        .as_primitive::<arrow::datatypes::TimestampNanosecondType>()
        .value(0);
    assert_eq!(t, 99);
}

type Row = (String, f64, Vec<(String, String)>);

fn metric_rows(wb: &WriteBatch) -> Vec<Row> {
    let Some((_, m)) = wb.batches.iter().find(|(t, _)| *t == Table::Metrics) else {
        return Vec::new();
    };
    let names = m.column(1).as_string::<i32>();
    let values = m.column(2).as_primitive::<Float64Type>();
    let maps = m.column(3).as_map();
    (0..m.num_rows())
        .map(|i| {
            let entry = maps.value(i);
            let k = entry.column(0).as_string::<i32>();
            let v = entry.column(1).as_string::<i32>();
            let labels = (0..k.len())
                .map(|j| (k.value(j).to_string(), v.value(j).to_string()))
                .collect();
            (names.value(i).to_string(), values.value(i), labels)
        })
        .collect()
}

#[test]
fn histograms_and_summaries_become_prometheus_style_rows() {
    let req = json(br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[
        {"name":"lat","histogram":{"aggregationTemporality":2,"dataPoints":[{"timeUnixNano":"5","count":"6","sum":12.5,"min":0.5,"max":9,
          "bucketCounts":["1","2","3"],"explicitBounds":[1,5],"attributes":[{"key":"route","value":{"stringValue":"/a"}}]}]}},
        {"name":"sz","exponentialHistogram":{"dataPoints":[{"timeUnixNano":"5","count":"4","sum":8,"scale":1,"positive":{"offset":0,"bucketCounts":["4"]}}]}},
        {"name":"rpc","summary":{"dataPoints":[{"timeUnixNano":"5","count":"10","sum":3,"quantileValues":[{"quantile":0.5,"value":0.2},{"quantile":0.99,"value":1.5}]}]}}
    ]}]}]}"#).expect("json");
    let (wb, stats) = to_write_batch(&req, 10).expect("decodes");
    assert_eq!(stats.points, 3);
    assert_eq!(stats.rejected, 0);
    let rows = metric_rows(&wb);
    let get = |name: &str, label: Option<(&str, &str)>| {
        rows.iter()
            .find(|(n, _, l)| {
                n == name && label.is_none_or(|(k, v)| l.iter().any(|(a, b)| a == k && b == v))
            })
            .map(|(_, v, _)| *v)
    };
    assert_eq!(get("lat_count", None), Some(6.0));
    assert_eq!(get("lat_sum", None), Some(12.5));
    assert_eq!(get("lat_min", None), Some(0.5));
    assert_eq!(get("lat_max", None), Some(9.0));
    assert_eq!(get("lat_bucket", Some(("le", "1"))), Some(1.0));
    assert_eq!(
        get("lat_bucket", Some(("le", "5"))),
        Some(3.0),
        "cumulative"
    );
    assert_eq!(get("lat_bucket", Some(("le", "+Inf"))), Some(6.0));
    assert!(
        rows.iter()
            .filter(|(n, _, _)| n == "lat_bucket")
            .all(|(_, _, l)| l.iter().any(|(k, v)| k == "route" && v == "/a"))
    );
    assert_eq!(get("sz_count", None), Some(4.0));
    assert_eq!(get("sz_sum", None), Some(8.0));
    assert_eq!(get("rpc_count", None), Some(10.0));
    assert_eq!(get("rpc", Some(("quantile", "0.99"))), Some(1.5));
    assert_eq!(rows.len(), 4 + 3 + 2 + 2 + 2);
}

#[test]
fn rejections_are_counted_and_explained() {
    let now: i64 = 1_700_000_000_000_000_000;
    let far = now + MAX_FUTURE + 1;
    let body = format!(
        r#"{{"resourceMetrics":[{{"scopeMetrics":[{{"metrics":[
        {{"name":"hw.energy","sum":{{"aggregationTemporality":1,"isMonotonic":true,"dataPoints":[
          {{"timeUnixNano":"{now}","asDouble":5,"attributes":[{{"key":"hw.id","value":{{"stringValue":"GPU-a"}}}}]}}]}}}},
        {{"name":"hw.power","sum":{{"aggregationTemporality":1,"dataPoints":[
          {{"timeUnixNano":"{now}","asDouble":300,"attributes":[{{"key":"hw.id","value":{{"stringValue":"GPU-a"}}}}]}}]}}}},
        {{"name":"requests","sum":{{"aggregationTemporality":1,"isMonotonic":true,"dataPoints":[
          {{"timeUnixNano":"{now}","asInt":"3"}}]}}}},
        {{"name":"g","gauge":{{"dataPoints":[{{"timeUnixNano":"{far}","asDouble":1}},{{"timeUnixNano":"{now}","asDouble":"Infinity"}},
          {{"timeUnixNano":"18446744073709551615","asDouble":1}},{{"timeUnixNano":"{now}"}}]}}}}
    ]}}]}}]}}"#
    );
    let req = json(body.as_bytes()).expect("json");
    let (wb, stats) = to_write_batch(&req, now).expect("decodes");
    assert_eq!(
        stats,
        DecodeStats {
            points: 2,
            rejected: 5,
            non_finite: 2,
            future: 2,
            delta_counter: 1,
            ..DecodeStats::default()
        }
    );
    let msg = stats.partial_success_message().expect("message");
    assert!(msg.starts_with("5 data points rejected"), "{msg}");
    assert!(msg.contains("cumulative temporality"), "{msg}");
    // A delta sum of a non-counter column (power) and of any other metric are kept.
    assert_eq!(wb.rows(), 2);
    assert_eq!(metric_rows(&wb)[0].0, "requests");
}

/// One GPU point of `name` with `value` and extra attributes `attrs` (JSON fragments).
fn semconv_request(schema_url: &str, metrics: &[(&str, f64, &str)]) -> String {
    let ms: Vec<String> = metrics
        .iter()
        .map(|(name, v, attrs)| {
            format!(
                r#"{{"name":"{name}","sum":{{"aggregationTemporality":2,"isMonotonic":true,"dataPoints":[
                  {{"timeUnixNano":"1700000000000000000","asDouble":{v},"attributes":[
                    {{"key":"hw.id","value":{{"stringValue":"GPU-a"}}}}{attrs}]}}]}}}}"#
            )
        })
        .collect();
    format!(
        r#"{{"resourceMetrics":[{{"resource":{{"attributes":[{{"key":"host.name","value":{{"stringValue":"n"}}}}]}},
          "scopeMetrics":[{{"scope":{{"name":"gpuwatch-agent"}},"schemaUrl":"{schema_url}","metrics":[{}]}}]}}]}}"#,
        ms.join(",")
    )
}

fn cell(b: &RecordBatch, col: &str) -> Option<f64> {
    let c = b.column_by_name(col).expect(col);
    if c.is_null(0) {
        return None;
    }
    Some(match c.data_type() {
        arrow::datatypes::DataType::Int64 => c.as_primitive::<Int64Type>().value(0) as f64,
        _ => c.as_primitive::<Float64Type>().value(0),
    })
}

#[test]
fn semantic_convention_names_and_those_of_earlier_agents() {
    let error = |t: &str| format!(r#",{{"key":"error.type","value":{{"stringValue":"{t}"}}}}"#);
    // This release's agent: hw.errors by error.type, the controller under its own name,
    // hw.gpu.memory.utilization (used/limit) a metric like any other.
    let (c, u) = (error("corrected"), error("uncorrected"));
    let body = semconv_request(
        "https://opentelemetry.io/schemas/1.37.0",
        &[
            ("hw.errors", 3.0, &c),
            ("hw.errors", 1.0, &u),
            ("gpu.memory_controller.utilization", 0.25, ""),
            ("hw.gpu.memory.utilization", 0.5, ""),
        ],
    );
    let req = json(body.as_bytes()).expect("json");
    let (wb, stats) = to_write_batch(&req, 1_700_000_000_000_000_000).expect("decode");
    assert_eq!(stats.rejected, 0);
    let g = wb
        .batches
        .iter()
        .find(|(t, _)| *t == Table::GpuMetrics)
        .expect("gpu")
        .1
        .clone();
    assert_eq!(cell(&g, "ecc_sbe_volatile_total"), Some(3.0));
    assert_eq!(cell(&g, "ecc_dbe_volatile_total"), Some(1.0));
    assert_eq!(cell(&g, "memory_utilization"), Some(0.25));
    let m = wb
        .batches
        .iter()
        .find(|(t, _)| *t == Table::Metrics)
        .expect("metrics")
        .1
        .clone();
    assert_eq!(
        m.column(1).as_string::<i32>().value(0),
        "hw.gpu.memory.utilization"
    );
    // An earlier agent (no schema URL): hw.gpu.memory.utilization is the controller's busy
    // time, the ECC counters have their own names.
    let body = semconv_request(
        "",
        &[
            ("hw.gpu.memory.utilization", 0.75, ""),
            ("gpu.ecc.sbe.volatile", 4.0, ""),
            ("gpu.ecc.dbe.volatile", 2.0, ""),
        ],
    );
    let req = json(body.as_bytes()).expect("json");
    let (wb, _) = to_write_batch(&req, 1_700_000_000_000_000_000).expect("decode");
    let g = wb
        .batches
        .iter()
        .find(|(t, _)| *t == Table::GpuMetrics)
        .expect("gpu")
        .1
        .clone();
    assert_eq!(cell(&g, "memory_utilization"), Some(0.75));
    assert_eq!(cell(&g, "ecc_sbe_volatile_total"), Some(4.0));
    assert_eq!(cell(&g, "ecc_dbe_volatile_total"), Some(2.0));
    assert!(wb.batches.iter().all(|(t, _)| *t != Table::Metrics));
}

#[test]
fn chargeback_attributes_fill_their_columns() {
    let body = r#"{"resourceMetrics":[{"resource":{"attributes":[
        {"key":"host.name","value":{"stringValue":"node-1"}},
        {"key":"k8s.pod.label.team","value":{"stringValue":"from-resource"}},
        {"key":"k8s.pod.label.project","value":{"stringValue":"llm"}}]},
      "scopeMetrics":[{"metrics":[
        {"name":"hw.power","unit":"W","gauge":{"dataPoints":[
          {"timeUnixNano":"1700000000000000000","asDouble":300,"attributes":[
            {"key":"hw.id","value":{"stringValue":"GPU-a"}},{"key":"job.id","value":{"stringValue":"42"}},
            {"key":"job.account","value":{"stringValue":"physics"}},
            {"key":"job.partition","value":{"stringValue":"gpu"}},
            {"key":"job.qos","value":{"stringValue":"high"}},
            {"key":"job.array_id","value":{"stringValue":"40"}},
            {"key":"job.array_task_id","value":{"stringValue":"2"}},
            {"key":"job.time_limit_seconds","value":{"intValue":"3600"}},
            {"key":"k8s.pod.label.team","value":{"stringValue":"vision"}}]},
          {"timeUnixNano":"1700000000000000000","asDouble":100,"attributes":[
            {"key":"hw.id","value":{"stringValue":"GPU-b"}},
            {"key":"job.time_limit_seconds","value":{"stringValue":"soon"}}]}]}}
      ]}]}]}"#;
    let req = json(body.as_bytes()).expect("valid json");
    let (wb, _) = to_write_batch(&req, 1_700_000_000_000_000_000).expect("decodes");
    let (_, b) = wb
        .batches
        .iter()
        .find(|(t, _)| *t == Table::GpuMetrics)
        .expect("gpu_metrics batch");
    let text = |n: &str, r: usize| {
        let c = b.column_by_name(n).expect(n);
        (!c.is_null(r)).then(|| c.as_string::<i32>().value(r).to_string())
    };
    for (col, want) in [
        ("job_account", "physics"),
        ("job_partition", "gpu"),
        ("job_qos", "high"),
        ("job_array_id", "40"),
        ("job_array_task_id", "2"),
        ("job_labels", "project=llm,team=vision"),
    ] {
        assert_eq!(text(col, 0).as_deref(), Some(want), "{col}");
    }
    let limit = b.column_by_name("job_time_limit_seconds").expect("limit");
    assert_eq!(limit.as_primitive::<Int64Type>().value(0), 3600);
    // Not a number: null, the row is kept.
    assert!(limit.is_null(1));
    assert_eq!(text("job_account", 1), None);
    assert_eq!(
        text("job_labels", 1).as_deref(),
        Some("project=llm,team=from-resource")
    );
}
