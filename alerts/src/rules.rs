//! Alert rule files (INTERFACE.md, "Alert rules"): YAML groups of rules, each with a SQL query
//! (`sql:`) or a PromQL expression (`expr:`, as Prometheus rule files and `PrometheusRule`
//! objects write them).
//!
//! Structural errors (unknown keys, wrong types, bad durations, SQL or PromQL that does not
//! parse, bad templates) are reported by the YAML decoder at the line and column of the
//! offending value.
//! Checks across rules (duplicate names) point at the line of the second `alert:`.

use std::collections::{BTreeMap, HashSet};
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
        let mut check = Checker::new(text, path);
        let raw: RawFile = serde_yaml_ng::from_str(text).map_err(|e| check.decode_error(&e))?;
        let mut groups = Vec::new();
        for (gi, g) in raw.groups.into_iter().enumerate() {
            groups.push(check.group(gi, g)?);
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

/// Checks the decoded groups and rules of one file, and points its errors at the file's lines.
struct Checker<'a> {
    path: &'a str,
    lines: Lines<'a>,
    group_names: HashSet<String>,
    alert_names: HashSet<String>,
    /// How many rules were checked before (the next one is at the next `alert:` key).
    rule_no: usize,
}

impl<'a> Checker<'a> {
    /// A checker of the file `path` whose text is `text`.
    fn new(text: &'a str, path: &'a str) -> Self {
        Self {
            path,
            lines: Lines::new(text),
            group_names: HashSet::new(),
            alert_names: HashSet::new(),
            rule_no: 0,
        }
    }

    /// An error at `line`; column 1 (an error found after decoding) becomes the column of the
    /// line's key.
    fn err(&self, line: usize, column: usize, message: String) -> Error {
        let column = if column == 1 {
            key_column(
                self.lines
                    .lines
                    .get(line.wrapping_sub(1))
                    .copied()
                    .unwrap_or(""),
            )
        } else {
            column
        };
        Error::Rules {
            path: self.path.to_string(),
            line,
            column,
            message,
        }
    }

    /// The YAML decoder's error at its position.
    fn decode_error(&self, e: &serde_yaml_ng::Error) -> Error {
        let (line, column) = e.location().map_or((1, 1), |l| (l.line(), l.column()));
        // The decoder appends "at line L column C"; the prefix already says where.
        let msg = e.to_string();
        let msg = match msg.find(" at line ") {
            Some(i) => msg[..i].to_string(),
            None => msg,
        };
        self.err(line, column, msg)
    }

    /// Checks the `gi`th group: a name unique in the file, its interval, then its rules.
    fn group(&mut self, gi: usize, g: RawGroup) -> Result<Group> {
        let gline = self.lines.nth_key("name", gi);
        if !self.group_names.insert(g.name.clone()) {
            return Err(self.err(
                gline,
                1,
                format!(
                    "duplicate group name {:?}: give each group its own name",
                    g.name
                ),
            ));
        }
        let interval = self.interval(gline, g.interval.as_deref())?;
        let mut rules = Vec::new();
        for r in g.rules {
            rules.push(self.rule(r)?);
        }
        Ok(Group {
            name: g.name,
            interval,
            rules,
        })
    }

    /// The `interval:` of the group at `gline` (1m when absent); it must be above zero.
    fn interval(&self, gline: usize, interval: Option<&str>) -> Result<Dur> {
        let Some(t) = interval else {
            return Ok(Dur(Duration::from_secs(60)));
        };
        let line = self.lines.key_after(gline, "interval");
        let d = parse_duration(t).map_err(|m| self.err(line, 1, format!("interval: {m}")))?;
        if d.is_zero() {
            return Err(self.err(line, 1, "interval: must be above zero".into()));
        }
        Ok(Dur(d))
    }

    /// Checks the next rule: a valid name unique in the file, its query, durations, labels and
    /// annotations.
    fn rule(&mut self, r: RawRule) -> Result<Rule> {
        let rline = self.lines.nth_key("alert", self.rule_no);
        self.rule_no += 1;
        check_name(&r.alert, "alert name")
            .map_err(|m| self.err(rline, 1, format!("alert: {m}")))?;
        if !self.alert_names.insert(r.alert.clone()) {
            return Err(self.err(
                rline,
                1,
                format!(
                    "duplicate alert name {:?}: alert names must be unique in a file",
                    r.alert
                ),
            ));
        }
        let query = self.query(rline, r.sql, r.expr)?;
        let for_ = self.duration(rline, "for", r.for_.as_deref())?;
        let keep_firing_for =
            self.duration(rline, "keep_firing_for", r.keep_firing_for.as_deref())?;
        let labels = self.labels(rline, r.labels)?;
        let annotations = self.annotations(rline, r.annotations)?;
        Ok(Rule {
            alert: AlertName(r.alert),
            query,
            for_,
            keep_firing_for,
            labels,
            annotations,
        })
    }

    /// The query of the rule at `rline`: exactly one of a read-only `sql:` and an alerting
    /// `expr:`.
    fn query(&self, rline: usize, sql: Option<String>, expr: Option<String>) -> Result<Query> {
        let at = |key: &str| self.lines.key_after(rline, key);
        match (sql, expr) {
            (Some(sql), None) => {
                gpuwatch_query::gate::check(&sql)
                    .map_err(|e| self.err(at("sql"), 1, format!("sql: {e}")))?;
                Ok(Query::Sql(Sql(sql)))
            }
            (None, Some(expr)) => {
                check_expr(&expr).map_err(|m| self.err(at("expr"), 1, format!("expr: {m}")))?;
                Ok(Query::PromQL(expr))
            }
            (Some(_), Some(_)) => Err(self.err(
                rline,
                1,
                "a rule has sql: or expr:, not both: keep one".into(),
            )),
            (None, None) => Err(self.err(
                rline,
                1,
                "a rule needs sql: (a SQL query) or expr: (a PromQL expression)".into(),
            )),
        }
    }

    /// The duration `key` of the rule at `rline` (zero when absent).
    fn duration(&self, rline: usize, key: &str, v: Option<&str>) -> Result<Dur> {
        match v {
            None => Ok(Dur::default()),
            Some(t) => parse_duration(t)
                .map(Dur)
                .map_err(|m| self.err(self.lines.key_after(rline, key), 1, format!("{key}: {m}"))),
        }
    }

    /// The `labels:` of the rule at `rline`: valid names, `alertname` not among them.
    fn labels(
        &self,
        rline: usize,
        raw: BTreeMap<String, String>,
    ) -> Result<BTreeMap<LabelName, String>> {
        let line = self.lines.key_after(rline, "labels");
        let mut labels = BTreeMap::new();
        for (k, v) in raw {
            check_name(&k, "label name").map_err(|m| self.err(line, 1, format!("labels: {m}")))?;
            if k == "alertname" {
                return Err(self.err(
                    line,
                    1,
                    "labels: alertname is set from alert: remove it from labels".into(),
                ));
            }
            labels.insert(LabelName(k), v);
        }
        Ok(labels)
    }

    /// The `annotations:` of the rule at `rline`, each a template that parses.
    fn annotations(
        &self,
        rline: usize,
        raw: BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, Tmpl>> {
        let mut annotations = BTreeMap::new();
        for (k, v) in raw {
            let t = Template::parse(&v).map_err(|m| {
                let line = self.lines.key_after(rline, &k);
                let line = if line == rline {
                    self.lines.key_after(rline, "annotations")
                } else {
                    line
                };
                self.err(line, 1, format!("annotation {k}: {m}"))
            })?;
            annotations.insert(k, Tmpl(t));
        }
        Ok(annotations)
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

/// What opens a YAML flow mapping (`labels: {severity: warning}`).
const FLOW_MAP_OPEN: char = '{';

/// Whether `line` has the key `key` inside a flow mapping (`annotations: {summary: "..."}`):
/// right after the mapping's opening or after a comma.
fn in_flow_mapping(line: &str, key: &str) -> bool {
    let needle = format!("{key}:");
    line.match_indices(&needle).any(|(i, _)| {
        let before = &line[..i];
        before.ends_with(FLOW_MAP_OPEN) || before.ends_with(", ")
    })
}

/// Finds keys in the text, for error positions of values the decoder accepted.
struct Lines<'a> {
    lines: Vec<&'a str>,
}

impl<'a> Lines<'a> {
    /// The lines of `text`.
    fn new(text: &'a str) -> Self {
        Self {
            lines: text.lines().collect(),
        }
    }

    /// The key of a line (after indentation, a list dash and a flow mapping's opening).
    fn key_of(line: &str) -> Option<&str> {
        let t = line.trim_start();
        let t = t.strip_prefix("- ").unwrap_or(t).trim_start();
        let t = t.strip_prefix(FLOW_MAP_OPEN).unwrap_or(t).trim_start();
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
            if in_flow_mapping(l, key) {
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
