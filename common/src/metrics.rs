//! Metrics: the registry every crate registers with, its two renderings, and the one writer of
//! exposition text that has to keep names a registry would change.
//!
//! The server, its store and its alerting, and the agent's own metrics, register counters,
//! gauges and histograms with a [`Registry`] (the `prometheus-client` crate, the Prometheus
//! project's own Rust client: no global state, histograms). Values that live elsewhere (atomics
//! of the store, the memory ceiling) are read at scrape time by a [`SampleCollector`];
//! [`build_info`] and [`ProcessCollector`] give `<prefix>_build_info` and the standard
//! `process_*` metrics.
//!
//! A registry renders as OpenMetrics text ([`encode`], what the server serves) or as the
//! Prometheus text format 0.0.4 ([`encode_text_into`], what the agent serves beside its
//! dcgm-exporter series). The 0.0.4 rendering rewrites the crate's OpenMetrics text, family by
//! family: a counter's `# HELP`/`# TYPE` name gains the `_total` its samples carry, an `info`
//! family becomes a gauge named `<name>_info`, `# UNIT`, `# EOF` and exemplars are left out.
//!
//! The agent's per-GPU `/metrics` series mimic dcgm-exporter: counters without `_total`, text
//! format 0.0.4, written on every scrape for every GPU. A registry would rename those counters
//! and cost more per scrape on that measured path, so they are written with [`TextWriter`] —
//! the only hand-written exposition, and the only label escaper.

use std::fmt::Write;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;

pub use prometheus_client;
pub use prometheus_client::registry::Registry;

/// Content type of the OpenMetrics text a [`Registry`] encodes to.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Content type of the Prometheus text format 0.0.4 ([`TextWriter`]).
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Buckets of latency histograms, in seconds: 100 µs to 60 s.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 15.0, 60.0,
];

/// A latency histogram with [`LATENCY_BUCKETS`].
pub fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// Encodes `registry` as OpenMetrics text.
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut out = String::with_capacity(8 << 10);
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

/// Appends `registry` to `out` as the Prometheus text format 0.0.4 ([`TEXT_CONTENT_TYPE`]).
///
/// Counter, gauge, histogram and info families render as they would from a 0.0.4 client;
/// other OpenMetrics types (state sets, gauge histograms, unknown) are typed `untyped`.
pub fn encode_text_into(out: &mut String, registry: &Registry) -> Result<(), std::fmt::Error> {
    let open = encode(registry)?;
    // `# HELP` comes before `# TYPE`, which decides the family's 0.0.4 name.
    let mut help: Option<&str> = None;
    for line in open.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.rsplit_once(' ').ok_or(std::fmt::Error)?;
            let (name, kind) = text_family(name, kind);
            if let Some(h) = help.take() {
                let text = h.split_once(' ').map_or("", |(_, t)| t);
                writeln!(out, "# HELP {name} {text}")?;
            }
            writeln!(out, "# TYPE {name} {kind}")?;
        } else if !line.starts_with('#') {
            out.push_str(without_exemplar(line));
            out.push('\n');
        }
        // `# UNIT` and `# EOF` have no 0.0.4 form.
    }
    Ok(())
}

/// The 0.0.4 name and type of an OpenMetrics family.
fn text_family<'a>(name: &'a str, kind: &'a str) -> (std::borrow::Cow<'a, str>, &'a str) {
    match kind {
        "counter" => (format!("{name}_total").into(), "counter"),
        "info" => (format!("{name}_info").into(), "gauge"),
        "gauge" | "histogram" | "summary" => (name.into(), kind),
        _ => (name.into(), "untyped"),
    }
}

/// A sample line without its OpenMetrics exemplar (` # {…} value`), which 0.0.4 lacks; a `#`
/// inside a quoted label value is not one.
fn without_exemplar(line: &str) -> &str {
    let bytes = line.as_bytes();
    let mut quoted = false;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if quoted => i += 1,
            b'"' => quoted = !quoted,
            b'#' if !quoted && i > 0 && bytes[i - 1] == b' ' => return line[..i - 1].trim_end(),
            _ => {}
        }
        i += 1;
    }
    line
}

/// Registers `<name>{version="…"} 1` (`name` without the `_info` suffix the encoder adds).
pub fn build_info(registry: &mut Registry, name: &str, version: &str) {
    registry.register(
        name,
        "Build of this process, always 1",
        Info::new(vec![("version".to_string(), version.to_string())]),
    );
}

/// The kind of a [`Sample`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
}

/// One value read at scrape time.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Its full name; a counter's ends in `_total`.
    pub name: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
    /// What it counts.
    pub help: &'static str,
    /// Label pairs (a bounded set).
    pub labels: Vec<(String, String)>,
    /// Its value now.
    pub value: f64,
}

impl Sample {
    /// An unlabelled sample.
    pub fn new(name: &'static str, kind: Kind, help: &'static str, value: f64) -> Self {
        Self {
            name,
            kind,
            help,
            labels: Vec::new(),
            value,
        }
    }
}

/// A collector of values other components keep (atomics, snapshots), read at each scrape.
pub struct SampleCollector<F> {
    read: F,
}

impl<F> std::fmt::Debug for SampleCollector<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SampleCollector").finish_non_exhaustive()
    }
}

impl<F> SampleCollector<F>
where
    F: Fn() -> Vec<Sample> + Send + Sync + 'static,
{
    /// A collector of what `read` returns; samples of one name must come one after the other.
    pub fn new(read: F) -> Self {
        Self { read }
    }
}

impl<F> Collector for SampleCollector<F>
where
    F: Fn() -> Vec<Sample> + Send + Sync + 'static,
{
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let samples = (self.read)();
        let mut i = 0;
        while i < samples.len() {
            let first = &samples[i];
            let family = samples[i..]
                .iter()
                .take_while(|s| s.name == first.name)
                .count();
            // The encoder adds `_total` to counters.
            let name = match first.kind {
                Kind::Counter => first.name.strip_suffix("_total").unwrap_or(first.name),
                Kind::Gauge => first.name,
            };
            let kind = match first.kind {
                Kind::Counter => ConstCounter::new(0.0f64).metric_type(),
                Kind::Gauge => ConstGauge::new(0.0f64).metric_type(),
            };
            let mut metric = encoder.encode_descriptor(name, first.help, None, kind)?;
            for s in &samples[i..i + family] {
                let m = metric.encode_family(&s.labels)?;
                match s.kind {
                    Kind::Counter => ConstCounter::new(s.value).encode(m)?,
                    Kind::Gauge => ConstGauge::new(s.value).encode(m)?,
                }
            }
            i += family;
        }
        Ok(())
    }
}

/// A histogram made after the registry (by a component that starts later), shown once it exists.
pub struct LateHistogram<F> {
    name: &'static str,
    help: &'static str,
    get: F,
}

impl<F> std::fmt::Debug for LateHistogram<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LateHistogram")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<F> LateHistogram<F>
where
    F: Fn() -> Option<Histogram> + Send + Sync + 'static,
{
    /// The histogram `get` returns, under `name`.
    pub fn new(name: &'static str, help: &'static str, get: F) -> Self {
        Self { name, help, get }
    }
}

impl<F> Collector for LateHistogram<F>
where
    F: Fn() -> Option<Histogram> + Send + Sync + 'static,
{
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(h) = (self.get)() else {
            return Ok(());
        };
        let metric = encoder.encode_descriptor(self.name, self.help, None, h.metric_type())?;
        h.encode(metric)
    }
}

/// The standard `process_*` metrics of this process, read from `/proc/self` at each scrape
/// (nothing on systems without it): CPU seconds, resident and virtual memory, open and maximum
/// file descriptors, threads, start time.
#[derive(Debug, Default)]
pub struct ProcessCollector;

/// Clock ticks per second of `/proc/<pid>/stat` (`USER_HZ`, 100 on every Linux ABI).
const USER_HZ: f64 = 100.0;

impl ProcessCollector {
    /// The samples now.
    pub fn samples() -> Vec<Sample> {
        let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
            return Vec::new();
        };
        // Fields after the command name, which may hold spaces, in parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            return Vec::new();
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
        let mut out = Vec::new();
        // rest[0] is field 3 (state): utime 14, stime 15, threads 20, starttime 22, vsize 23,
        // rss 24 (pages).
        if let (Some(u), Some(s)) = (num(11), num(12)) {
            out.push(Sample::new(
                "process_cpu_seconds_total",
                Kind::Counter,
                "Total user and system CPU time spent in seconds",
                (u + s) / USER_HZ,
            ));
        }
        if let Some(rss) = status_kib("VmRSS:") {
            out.push(Sample::new(
                "process_resident_memory_bytes",
                Kind::Gauge,
                "Resident memory size in bytes",
                rss * 1024.0,
            ));
        }
        if let Some(v) = num(20) {
            out.push(Sample::new(
                "process_virtual_memory_bytes",
                Kind::Gauge,
                "Virtual memory size in bytes",
                v,
            ));
        }
        if let Some(t) = num(17) {
            out.push(Sample::new(
                "process_threads",
                Kind::Gauge,
                "Number of OS threads",
                t,
            ));
        }
        if let (Some(start), Some(boot)) = (num(19), boot_time()) {
            out.push(Sample::new(
                "process_start_time_seconds",
                Kind::Gauge,
                "Start time of the process since unix epoch in seconds",
                boot + start / USER_HZ,
            ));
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            out.push(Sample::new(
                "process_open_fds",
                Kind::Gauge,
                "Number of open file descriptors",
                fds.count() as f64,
            ));
        }
        if let Some(max) = max_fds() {
            out.push(Sample::new(
                "process_max_fds",
                Kind::Gauge,
                "Maximum number of open file descriptors",
                max,
            ));
        }
        out
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        SampleCollector::new(Self::samples).encode(encoder)
    }
}

fn status_kib(key: &str) -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

fn boot_time() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("btime "))?;
    line["btime ".len()..].trim().parse().ok()
}

/// The open-file limit of the process (the soft `RLIMIT_NOFILE`, from /proc/self/limits),
/// `None` when unknown or unlimited.
pub fn open_file_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn max_fds() -> Option<f64> {
    open_file_limit().map(|n| n as f64)
}

/// Appends `value` to `out` escaped as a label value: backslash, double quote and newline.
pub fn escape_label_into(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// `value` escaped as a label value.
pub fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    escape_label_into(&mut out, value);
    out
}

/// Writes the Prometheus text format 0.0.4 into a string: families, then their samples.
#[derive(Debug)]
pub struct TextWriter<'a> {
    out: &'a mut String,
}

impl<'a> TextWriter<'a> {
    /// A writer appending to `out`.
    pub fn new(out: &'a mut String) -> Self {
        Self { out }
    }

    /// `# HELP` and `# TYPE` of a family (`kind`: `counter`, `gauge`).
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// A sample whose labels are written already (`a="1",b="2"`, escaped), or none.
    pub fn sample_with(&mut self, name: &str, labels: &str, value: f64) {
        if labels.is_empty() {
            let _ = writeln!(self.out, "{name} {value}");
        } else {
            let _ = writeln!(self.out, "{name}{{{labels}}} {value}");
        }
    }

    /// A sample with `labels`, escaped here.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let mut l = String::new();
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                l.push(',');
            }
            l.push_str(k);
            l.push_str("=\"");
            escape_label_into(&mut l, v);
            l.push('"');
        }
        self.sample_with(name, &l, value);
    }

    /// A family of one unlabelled sample.
    pub fn one(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample_with(name, "", value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_and_text_lines() {
        assert_eq!(escape_label("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
        let mut out = String::new();
        let mut w = TextWriter::new(&mut out);
        w.one("x_total", "counter", "Things", 3.0);
        w.family("y", "gauge", "Ys");
        w.sample("y", &[("k", "v\"1"), ("j", "2")], 1.5);
        assert_eq!(
            out,
            "# HELP x_total Things\n# TYPE x_total counter\nx_total 3\n# HELP y Ys\n# TYPE y gauge\ny{k=\"v\\\"1\",j=\"2\"} 1.5\n"
        );
    }

    #[test]
    fn registry_with_samples_build_info_and_process() {
        let mut r = Registry::default();
        build_info(&mut r, "t_build", "1.2.3");
        r.register_collector(Box::new(SampleCollector::new(|| {
            vec![
                Sample::new("t_writes_total", Kind::Counter, "Writes", 2.0),
                Sample {
                    labels: vec![("outcome".into(), "stored".into())],
                    ..Sample::new("t_rows", Kind::Gauge, "Rows", 5.0)
                },
            ]
        })));
        r.register_collector(Box::new(ProcessCollector));
        let text = encode(&r).expect("encode");
        assert!(text.contains("t_build_info{version=\"1.2.3\"} 1"), "{text}");
        assert!(text.contains("t_writes_total 2"), "{text}");
        assert!(text.contains("t_rows{outcome=\"stored\"} 5"), "{text}");
        if std::path::Path::new("/proc/self/stat").exists() {
            assert!(text.contains("process_resident_memory_bytes "), "{text}");
            assert!(text.contains("process_cpu_seconds_total "), "{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn text_rendering_is_prometheus_0_0_4() {
        use prometheus_client::metrics::counter::Counter;
        use prometheus_client::metrics::exemplar::CounterWithExemplar;
        use prometheus_client::metrics::family::Family;
        use prometheus_client::metrics::gauge::Gauge;

        let mut r = Registry::default();
        build_info(&mut r, "t_build", "1.2.3");
        let c: Counter = Counter::default();
        c.inc_by(3);
        r.register("t_writes", "Writes done", c);
        let g: Gauge = Gauge::default();
        g.set(-2);
        r.register("t_queue", "Queued", g);
        let f: Family<[(&str, &str); 1], Counter> = Family::default();
        f.get_or_create(&[("call", "a # b \"q\"")]).inc();
        r.register("t_errors", "Errors by call", f);
        let h = latency_histogram();
        h.observe(0.002);
        r.register("t_latency_seconds", "Latency", h);
        let e: CounterWithExemplar<Vec<(String, String)>> = CounterWithExemplar::default();
        e.inc_by(1, Some(vec![("trace".into(), "x".into())]), None);
        r.register("t_traced", "Traced", e);

        let mut text = String::new();
        encode_text_into(&mut text, &r).expect("encode");
        let expect_start = "# HELP t_build_info Build of this process, always 1.\n\
            # TYPE t_build_info gauge\n\
            t_build_info{version=\"1.2.3\"} 1\n\
            # HELP t_writes_total Writes done.\n\
            # TYPE t_writes_total counter\n\
            t_writes_total 3\n\
            # HELP t_queue Queued.\n\
            # TYPE t_queue gauge\n\
            t_queue -2\n\
            # HELP t_errors_total Errors by call.\n\
            # TYPE t_errors_total counter\n\
            t_errors_total{call=\"a # b \\\"q\\\"\"} 1\n\
            # HELP t_latency_seconds Latency.\n\
            # TYPE t_latency_seconds histogram\n";
        assert!(text.starts_with(expect_start), "{text}");
        assert!(
            text.contains("t_latency_seconds_bucket{le=\"0.0025\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("t_latency_seconds_count 1\n"), "{text}");
        assert!(
            text.ends_with(
                "# HELP t_traced_total Traced.\n# TYPE t_traced_total counter\nt_traced_total 1\n"
            ),
            "{text}"
        );
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        assert!(
            !text.contains("trace="),
            "exemplars have no 0.0.4 form: {text}"
        );
    }
}
