//! Alert rule files (INTERFACE.md, "Alert rules"): YAML groups of rules, each with a SQL query
//! (`sql:`) or a PromQL expression (`expr:`, as Prometheus rule files and `PrometheusRule`
//! objects write them).
//!
//! Structural errors (unknown keys, wrong types, bad durations, SQL or PromQL that does not
//! parse, bad templates) are reported by the YAML decoder at the line and column of the
//! offending value.
//! Checks across rules (duplicate names) point at the line of the second `alert:`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer};

use crate::error::{Error, Result};
use crate::template::Template;

/// A parsed rules file.
#[derive(Debug, Clone)]
pub struct RuleFile {
    /// The rule groups.
    pub groups: Vec<Group>,
}

/// A group of rules evaluated together every `interval`.
#[derive(Debug, Clone)]
pub struct Group {
    /// The group's name (unique in the file).
    pub name: String,
    /// How often the group's rules run [default: 1m].
    pub interval: Dur,
    /// The rules.
    pub rules: Vec<Rule>,
}

/// One alerting rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// The alert's name (label `alertname`).
    pub alert: AlertName,
    /// The query: SQL (each row is one alert instance, its `value` column the value and every
    /// other column a label) or PromQL (each series of the result is one, its labels the
    /// instance's labels and its sample the value).
    pub query: Query,
    /// How long an instance must be returned before it fires [default: 0s].
    pub for_: Dur,
    /// How long a firing instance keeps firing after the query stops returning it [default: 0s].
    pub keep_firing_for: Dur,
    /// Labels added to every instance (they win over query columns of the same name).
    pub labels: BTreeMap<LabelName, String>,
    /// Templated annotations.
    pub annotations: BTreeMap<String, Tmpl>,
}

// The file as written: structure is checked by the decoder (with its positions), values after,
// at the line of their key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    groups: Vec<RawGroup>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    name: String,
    #[serde(default)]
    interval: Option<String>,
    rules: Vec<RawRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    alert: String,
    #[serde(default)]
    sql: Option<String>,
    #[serde(default)]
    expr: Option<String>,
    #[serde(default, rename = "for")]
    for_: Option<String>,
    #[serde(default)]
    keep_firing_for: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// A duration written as Prometheus does (`30s`, `5m`, `1h30m`, `2d`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s).map(Dur).map_err(de::Error::custom)
    }
}

/// Parses `30s`, `5m`, `1h30m`, `250ms`, `2d`, `1w`.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(t)
        .map_err(|e| format!("invalid duration {s:?} ({e}): use e.g. 30s, 5m, 1h30m"))
}

/// An alert name: letters, digits and `_`, not starting with a digit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AlertName(pub String);

impl fmt::Display for AlertName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A label name, as Prometheus allows them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LabelName(pub String);

fn check_name(s: &str, what: &str) -> std::result::Result<(), String> {
    let ok = !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid {what} {s:?}: use letters, digits and _, not starting with a digit"
        ))
    }
}

/// A read-only SQL statement, checked by the server's statement gate when the file is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sql(pub String);

/// A parsed annotation template.
#[derive(Debug, Clone, PartialEq)]
pub struct Tmpl(pub Template);

impl RuleFile {
    /// Reads and checks a rules file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            what: "cannot read rules file",
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and checks the text of a rules file; `path` names it in errors.
    pub fn parse(text: &str, path: &str) -> Result<Self> {
        let text_lines: Vec<&str> = text.lines().collect();
        // Errors found after decoding point at their key: column 1 becomes the key's column.
        let err = |line: usize, column: usize, message: String| Error::Rules {
            path: path.to_string(),
            line,
            column: if column == 1 {
                key_column(text_lines.get(line.wrapping_sub(1)).copied().unwrap_or(""))
            } else {
                column
            },
            message,
        };
        let raw: RawFile = serde_yaml_ng::from_str(text).map_err(|e| {
            let (line, column) = e.location().map_or((1, 1), |l| (l.line(), l.column()));
            // The decoder appends "at line L column C"; the prefix already says where.
            let msg = e.to_string();
            let msg = match msg.find(" at line ") {
                Some(i) => msg[..i].to_string(),
                None => msg,
            };
            err(line, column, msg)
        })?;
        let lines = Lines::new(text);
        let mut groups = Vec::new();
        let mut group_names = std::collections::HashSet::new();
        let mut alert_names = std::collections::HashSet::new();
        let mut rule_no = 0usize;
        for (gi, g) in raw.groups.into_iter().enumerate() {
            let gline = lines.nth_key("name", gi);
            if !group_names.insert(g.name.clone()) {
                return Err(err(
                    gline,
                    1,
                    format!(
                        "duplicate group name {:?}: give each group its own name",
                        g.name
                    ),
                ));
            }
            let interval = match &g.interval {
                None => Dur(Duration::from_secs(60)),
                Some(t) => {
                    let d = parse_duration(t).map_err(|m| {
                        err(
                            lines.key_after(gline, "interval"),
                            1,
                            format!("interval: {m}"),
                        )
                    })?;
                    if d.is_zero() {
                        return Err(err(
                            lines.key_after(gline, "interval"),
                            1,
                            "interval: must be above zero".into(),
                        ));
                    }
                    Dur(d)
                }
            };
            let mut rules = Vec::new();
            for r in g.rules {
                let rline = lines.nth_key("alert", rule_no);
                rule_no += 1;
                let at = |key: &str| lines.key_after(rline, key);
                check_name(&r.alert, "alert name")
                    .map_err(|m| err(rline, 1, format!("alert: {m}")))?;
                if !alert_names.insert(r.alert.clone()) {
                    return Err(err(
                        rline,
                        1,
                        format!(
                            "duplicate alert name {:?}: alert names must be unique in a file",
                            r.alert
                        ),
                    ));
                }
                let query = match (r.sql, r.expr) {
                    (Some(sql), None) => {
                        gpuwatch_query::gate::check(&sql)
                            .map_err(|e| err(at("sql"), 1, format!("sql: {e}")))?;
                        Query::Sql(Sql(sql))
                    }
                    (None, Some(expr)) => {
                        check_expr(&expr).map_err(|m| err(at("expr"), 1, format!("expr: {m}")))?;
                        Query::PromQL(expr)
                    }
                    (Some(_), Some(_)) => {
                        return Err(err(
                            rline,
                            1,
                            "a rule has sql: or expr:, not both: keep one".into(),
                        ));
                    }
                    (None, None) => {
                        return Err(err(
                            rline,
                            1,
                            "a rule needs sql: (a SQL query) or expr: (a PromQL expression)".into(),
                        ));
                    }
                };
                let dur = |key: &str, v: &Option<String>| -> Result<Dur> {
                    match v {
                        None => Ok(Dur::default()),
                        Some(t) => parse_duration(t)
                            .map(Dur)
                            .map_err(|m| err(at(key), 1, format!("{key}: {m}"))),
                    }
                };
                let for_ = dur("for", &r.for_)?;
                let keep_firing_for = dur("keep_firing_for", &r.keep_firing_for)?;
                let mut labels = BTreeMap::new();
                for (k, v) in r.labels {
                    check_name(&k, "label name")
                        .map_err(|m| err(at("labels"), 1, format!("labels: {m}")))?;
                    if k == "alertname" {
                        return Err(err(
                            at("labels"),
                            1,
                            "labels: alertname is set from alert: remove it from labels".into(),
                        ));
                    }
                    labels.insert(LabelName(k), v);
                }
                let mut annotations = BTreeMap::new();
                for (k, v) in r.annotations {
                    let t = Template::parse(&v).map_err(|m| {
                        let line = lines.key_after(rline, &k);
                        let line = if line == rline {
                            at("annotations")
                        } else {
                            line
                        };
                        err(line, 1, format!("annotation {k}: {m}"))
                    })?;
                    annotations.insert(k, Tmpl(t));
                }
                rules.push(Rule {
                    alert: AlertName(r.alert),
                    query,
                    for_,
                    keep_firing_for,
                    labels,
                    annotations,
                });
            }
            groups.push(Group {
                name: g.name,
                interval,
                rules,
            });
        }
        Ok(RuleFile { groups })
    }

    /// Appends the rules of `other` (e.g. a second file); names must stay unique.
    pub fn merge(&mut self, other: RuleFile) -> Result<()> {
        for g in other.groups {
            for r in &g.rules {
                if self.rules().any(|x| x.alert == r.alert) {
                    return Err(Error::Config(format!(
                        "alert {} is defined in two rules files: rename one",
                        r.alert
                    )));
                }
            }
            self.groups.push(g);
        }
        Ok(())
    }

    /// Every rule of every group.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.groups.iter().flat_map(|g| g.rules.iter())
    }
}

/// A rule's query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    /// `sql:`, a read-only SQL query.
    Sql(Sql),
    /// `expr:`, a PromQL expression evaluated at the evaluation time.
    PromQL(String),
}

/// A PromQL alerting expression must parse, use only what gpuwatch evaluates, and give an
/// instant vector (or a scalar).
fn check_expr(expr: &str) -> std::result::Result<(), String> {
    let e = gpuwatch_promql::parse_query(expr).map_err(|e| {
        let m = e.to_string();
        m.strip_prefix("invalid parameter \"query\": ")
            .map_or(m.clone(), str::to_string)
    })?;
    match e.value_type() {
        promql_parser::parser::value::ValueType::Vector
        | promql_parser::parser::value::ValueType::Scalar => Ok(()),
        other => Err(format!(
            "the expression gives a {other}: an alerting expression gives an instant vector"
        )),
    }
}

/// The 1-based column of a line's key (after indentation and a list dash).
fn key_column(line: &str) -> usize {
    let indent = line.len() - line.trim_start().len();
    let rest = &line[indent..];
    let dash = rest
        .strip_prefix("- ")
        .map_or(0, |r| rest.len() - r.trim_start().len());
    indent + dash + 1
}

/// Finds keys in the text, for error positions of values the decoder accepted.
struct Lines<'a> {
    lines: Vec<&'a str>,
}

impl<'a> Lines<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            lines: text.lines().collect(),
        }
    }

    fn key_of(line: &str) -> Option<&str> {
        let t = line.trim_start();
        let t = t.strip_prefix("- ").unwrap_or(t).trim_start();
        let t = t.strip_prefix('{').unwrap_or(t).trim_start();
        let colon = t.find(':')?;
        Some(t[..colon].trim().trim_matches(|c| c == '"' || c == '\''))
    }

    /// The 1-based line of the `n`th (0-based) line whose key is `key`.
    fn nth_key(&self, key: &str, n: usize) -> usize {
        self.lines
            .iter()
            .enumerate()
            .filter(|(_, l)| Self::key_of(l) == Some(key))
            .nth(n)
            .map_or(1, |(i, _)| i + 1)
    }

    /// The first line at or after `from` (1-based) with key `key`, before the next rule; `from`
    /// if there is none.
    fn key_after(&self, from: usize, key: &str) -> usize {
        for (i, l) in self.lines.iter().enumerate().skip(from.saturating_sub(1)) {
            if i + 1 > from && l.trim_start().starts_with("- alert:") {
                break;
            }
            if Self::key_of(l) == Some(key) {
                return i + 1;
            }
            // Flow mappings: `annotations: {summary: "..."}`
            if l.contains(&format!("{{{key}:")) || l.contains(&format!(", {key}:")) {
                return i + 1;
            }
        }
        from
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"groups:
  - name: gpu
    interval: 1m
    rules:
      - alert: GpuIdle
        sql: |
          SELECT host, gpu_uuid, job_id, max(gpu_utilization) AS value
          FROM gpu_metrics WHERE time > now() - interval '30 minutes' AND job_id IS NOT NULL
          GROUP BY host, gpu_uuid, job_id HAVING max(gpu_utilization) < 0.01
        for: 30m
        keep_firing_for: 0s
        labels: {severity: warning}
        annotations: {summary: "GPU {{ labels.gpu_uuid }} on {{ labels.host }} idle in job {{ labels.job_id }}"}
"#;

    fn line_of(text: &str) -> (usize, String) {
        match RuleFile::parse(text, "r.yaml") {
            Err(Error::Rules { line, message, .. }) => (line, message),
            other => panic!("expected a rules error, got {other:?}"),
        }
    }

    #[test]
    fn interface_example_parses() {
        let f = RuleFile::parse(GOOD, "r.yaml").expect("parse");
        let r = &f.groups[0].rules[0];
        assert_eq!(r.alert.0, "GpuIdle");
        assert_eq!(r.for_.0, Duration::from_secs(1800));
        assert_eq!(f.groups[0].interval.0, Duration::from_secs(60));
        assert_eq!(
            r.labels
                .get(&LabelName("severity".into()))
                .map(String::as_str),
            Some("warning")
        );
    }

    #[test]
    fn errors_point_at_the_line() {
        let (line, msg) = line_of(&GOOD.replace("for: 30m", "for: 30 parsecs"));
        assert_eq!(line, 10, "{msg}");
        match RuleFile::parse(&GOOD.replace("for: 30m", "for: 30 parsecs"), "r.yaml") {
            Err(Error::Rules { column, .. }) => assert_eq!(column, 9),
            other => panic!("{other:?}"),
        }
        match RuleFile::parse(&GOOD.replace("alert: GpuIdle", "alert: 1dle"), "r.yaml") {
            Err(Error::Rules { line, column, .. }) => assert_eq!((line, column), (5, 9)),
            other => panic!("{other:?}"),
        }
        assert!(msg.contains("invalid duration"), "{msg}");

        let (line, msg) = line_of(&GOOD.replace("keep_firing_for: 0s", "keep_firing: 0s"));
        assert_eq!(line, 11, "{msg}");
        assert!(msg.contains("keep_firing"), "{msg}");

        let (line, msg) = line_of(&GOOD.replace("{{ labels.host }}", "{{ host }}"));
        assert_eq!(line, 13, "{msg}");

        let (line, msg) = line_of(&GOOD.replace("SELECT host,", "DELETE host,"));
        assert_eq!(line, 6, "{msg}");
        assert!(msg.contains("sql"), "{msg}");

        let (line, msg) = line_of(&GOOD.replace("alert: GpuIdle", "alert: Gpu-Idle"));
        assert_eq!(line, 5, "{msg}");

        let twice = format!("{GOOD}      - alert: GpuIdle\n        sql: SELECT 1 AS value\n");
        let (line, msg) = line_of(&twice);
        assert_eq!(line, 14, "{msg}");
        assert!(msg.contains("duplicate"), "{msg}");

        let (line, _) = line_of("groups:\n  - name: x\n    rules: 3\n");
        assert_eq!(line, 3);
    }

    /// A PrometheusRule as dcgm-exporter users write them, unchanged.
    const PROM: &str = r#"groups:
  - name: gpu.rules
    rules:
      - alert: GPUHighTemperature
        expr: DCGM_FI_DEV_GPU_TEMP > 85
        for: 5m
        labels:
          severity: warning
        annotations:
          summary: "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} is at {{ $value }} C"
      - alert: GPUXidError
        expr: increase(DCGM_FI_DEV_XID_ERRORS[5m]) > 0
"#;

    #[test]
    fn promql_rules_parse_and_bad_ones_point_at_their_line() {
        let f = RuleFile::parse(PROM, "r.yaml").expect("parse");
        let r = &f.groups[0].rules[0];
        assert_eq!(r.query, Query::PromQL("DCGM_FI_DEV_GPU_TEMP > 85".into()));
        assert_eq!(r.for_.0, Duration::from_secs(300));

        let (line, msg) =
            line_of(&PROM.replace("DCGM_FI_DEV_GPU_TEMP > 85", "sum(DCGM_FI_DEV_GPU_TEMP"));
        assert_eq!(line, 5, "{msg}");
        assert!(msg.starts_with("expr:"), "{msg}");
        let (line, msg) =
            line_of(&PROM.replace("DCGM_FI_DEV_GPU_TEMP > 85", "DCGM_FI_DEV_GPU_TEMP[5m]"));
        assert_eq!(line, 5, "{msg}");
        assert!(msg.contains("instant vector"), "{msg}");
        let (line, msg) = line_of(&PROM.replace(
            "increase(DCGM_FI_DEV_XID_ERRORS[5m])",
            "histogram_count(DCGM_FI_DEV_XID_ERRORS)",
        ));
        assert_eq!(line, 12, "{msg}");
        assert!(msg.contains("histogram_count"), "{msg}");
        let both = PROM.replace(
            "        expr: DCGM_FI_DEV_GPU_TEMP > 85\n",
            "        expr: DCGM_FI_DEV_GPU_TEMP > 85\n        sql: SELECT 1 AS value\n",
        );
        let (line, msg) = line_of(&both);
        assert_eq!(line, 4, "{msg}");
        assert!(msg.contains("not both"), "{msg}");
        let neither = PROM.replace("        expr: DCGM_FI_DEV_GPU_TEMP > 85\n", "");
        let (line, msg) = line_of(&neither);
        assert_eq!(line, 4, "{msg}");
        assert!(msg.contains("sql:") && msg.contains("expr:"), "{msg}");
    }
}
