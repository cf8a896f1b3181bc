//! Annotation templates: `{{ labels.NAME }}`, `{{ value }}` (and Prometheus' `{{ $labels.NAME }}`,
//! `{{ $value }}`, with the formatting Prometheus rule files use most: `{{ $value | humanize }}`,
//! `{{ $value | humanizePercentage }}`, `{{ printf "%.2f" $value }}`). Nothing else is evaluated:
//! an unknown expression is an error at load time.

use std::collections::BTreeMap;

/// One piece of a parsed template.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Label(String),
    Value,
    /// The value with SI prefixes (`humanize`).
    Humanized,
    /// The value as a percentage (`humanizePercentage`).
    Percent,
    /// The value with this many decimals (`printf "%.Nf" $value`).
    Fixed(usize),
}

/// The value pieces: `value`, `value | humanize`, `printf "%.2f" value`, … (`$` already gone).
fn value_piece(expr: &str) -> Option<Piece> {
    let squeeze: String = expr.split_whitespace().collect::<Vec<_>>().join(" ");
    match squeeze.replace("$value", "value").as_str() {
        "value" => Some(Piece::Value),
        "value | humanize" => Some(Piece::Humanized),
        "value | humanizePercentage" => Some(Piece::Percent),
        other => {
            let rest = other.strip_prefix("printf \"%.")?;
            let (n, tail) = rest.split_once("f\" ")?;
            (tail == "value").then_some(())?;
            n.parse().ok().filter(|n| *n <= 12).map(Piece::Fixed)
        }
    }
}

/// Prometheus's `humanize`: SI prefixes, 4 significant digits.
fn humanize(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format_value(v);
    }
    let big = [
        (1e18, "E"),
        (1e15, "P"),
        (1e12, "T"),
        (1e9, "G"),
        (1e6, "M"),
        (1e3, "k"),
    ];
    let small = [(1e-3, "m"), (1e-6, "u"), (1e-9, "n"), (1e-12, "p")];
    let (scaled, prefix) = if v.abs() >= 1.0 {
        big.iter()
            .find(|(f, _)| v.abs() >= *f)
            .map_or((v, ""), |(f, p)| (v / f, *p))
    } else {
        small
            .iter()
            .find(|(f, _)| v.abs() >= *f)
            .map_or((v, ""), |(f, p)| (v / f, *p))
    };
    format!("{}{prefix}", significant(scaled, 4))
}

/// `v` with `digits` significant digits and no trailing zeros (Go's `%.4g` for these ranges).
fn significant(v: f64, digits: i32) -> String {
    let magnitude = if v == 0.0 {
        0
    } else {
        v.abs().log10().floor() as i32
    };
    let decimals = (digits - 1 - magnitude).max(0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A parsed annotation template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    pieces: Vec<Piece>,
}

impl Template {
    /// Parses `text`; the error says which expression is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 2..];
            let Some(close) = after.find("}}") else {
                return Err(format!(
                    "unclosed '{{{{' in template {text:?}: close it with '}}}}'"
                ));
            };
            let expr = after[..close].trim();
            let expr = expr.strip_prefix('$').unwrap_or(expr);
            if let Some(p) = value_piece(expr) {
                pieces.push(p);
            } else if let Some(name) = expr.strip_prefix("labels.") {
                if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(format!(
                        "bad label name {name:?} in template {text:?}: use letters, digits and _"
                    ));
                }
                pieces.push(Piece::Label(name.to_string()));
            } else {
                return Err(format!(
                    "unknown template expression {{{{ {expr} }}}} in {text:?}: use {{{{ labels.NAME }}}} or {{{{ value }}}}"
                ));
            }
            rest = &after[close + 2..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_string()));
        }
        Ok(Self { pieces })
    }

    /// Renders with the alert's labels and value; a missing label renders empty.
    pub fn render(&self, labels: &BTreeMap<String, String>, value: f64) -> String {
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Label(l) => out.push_str(labels.get(l).map(String::as_str).unwrap_or("")),
                Piece::Value => out.push_str(&format_value(value)),
                Piece::Humanized => out.push_str(&humanize(value)),
                Piece::Percent => out.push_str(&format!("{}%", significant(value * 100.0, 4))),
                Piece::Fixed(n) => out.push_str(&format!("{value:.n$}")),
            }
        }
        out
    }
}

/// A value as people read it: integers without a fraction, others with up to 4 significant decimals.
pub fn format_value(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else if v.is_finite() {
        let s = format!("{v:.4}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_string()
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_labels_and_value() {
        let t = Template::parse("GPU {{ labels.gpu_uuid }} on {{$labels.host}} at {{ value }}!")
            .expect("parse");
        let mut l = BTreeMap::new();
        l.insert("gpu_uuid".to_string(), "GPU-1".to_string());
        l.insert("host".to_string(), "n1".to_string());
        assert_eq!(t.render(&l, 0.25), "GPU GPU-1 on n1 at 0.25!");
        assert_eq!(t.render(&BTreeMap::new(), 3.0), "GPU  on  at 3!");
    }

    #[test]
    fn rejects_unknown_and_unclosed() {
        assert!(Template::parse("{{ humanize value }}").is_err());
        assert!(Template::parse("{{ labels.x ").is_err());
        assert!(Template::parse("{{ labels.a-b }}").is_err());
        assert_eq!(
            Template::parse("plain")
                .expect("plain")
                .render(&BTreeMap::new(), 1.0),
            "plain"
        );
    }

    #[test]
    fn prometheus_value_formatting() {
        let t = Template::parse(
            "{{ $value | humanize }} {{ $value | humanizePercentage }} {{ printf \"%.2f\" $value }}",
        )
        .expect("parse");
        let labels = BTreeMap::new();
        assert_eq!(t.render(&labels, 0.123456), "123.5m 12.35% 0.12");
        assert_eq!(
            t.render(&labels, 1_234_567.0),
            "1.235M 123456700% 1234567.00"
        );
        assert!(Template::parse("{{ $value | title }}").is_err());
    }
}
