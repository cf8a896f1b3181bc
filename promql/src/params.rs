//! Request parameters as Prometheus's HTTP API reads them: from the query string and a
//! form-encoded body, times as Unix seconds or RFC 3339, durations as `5m` or seconds.

use crate::error::{Result, bad};

/// The parameters of a request, in order (a name may repeat: `match[]`).
#[derive(Debug, Default, Clone)]
pub struct Params(pub Vec<(String, String)>);

impl Params {
    /// Parameters from a query string and a form body (`application/x-www-form-urlencoded`);
    /// the body's come first, as Go's `ParseForm` ranks them.
    pub fn parse(query: Option<&str>, form: Option<&[u8]>) -> Self {
        let mut out = Vec::new();
        if let Some(body) = form {
            out.extend(url::form_urlencoded::parse(body).into_owned());
        }
        if let Some(q) = query {
            out.extend(url::form_urlencoded::parse(q.as_bytes()).into_owned());
        }
        Params(out)
    }

    /// The first value of `name`; an empty value counts as absent.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, v)| k == name && !v.is_empty())
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `name`.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// Milliseconds since the epoch of a Prometheus time parameter.
pub fn parse_time(name: &str, s: &str) -> Result<i64> {
    if let Ok(f) = s.parse::<f64>() {
        if !f.is_finite() || f.abs() > 9.2e15 {
            return Err(bad(format!(
                "invalid parameter \"{name}\": cannot parse \"{s}\" to a valid timestamp"
            )));
        }
        let secs = f.trunc();
        let ms = ((f - secs) * 1000.0).round();
        return Ok(secs as i64 * 1000 + ms as i64);
    }
    parse_rfc3339(s).ok_or_else(|| {
        bad(format!(
            "invalid parameter \"{name}\": cannot parse \"{s}\" to a valid timestamp"
        ))
    })
}

/// `2006-01-02T15:04:05.999999999Z07:00` to milliseconds.
fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !(b[10] == b'T' || b[10] == b't') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[13] != b':' || b[16] != b':' || !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    let mut pos = 19;
    let mut ms = 0i64;
    if b.get(pos) == Some(&b'.') {
        pos += 1;
        let start = pos;
        while pos < b.len() && b[pos].is_ascii_digit() {
            pos += 1;
        }
        let frac = s.get(start..pos)?;
        let mut digits: String = frac.chars().take(3).collect();
        while digits.len() < 3 {
            digits.push('0');
        }
        ms = digits.parse().ok()?;
    }
    let offset = match s.get(pos..)? {
        "Z" | "z" => 0,
        tz if tz.len() == 6 && (tz.starts_with('+') || tz.starts_with('-')) => {
            let sign = if tz.starts_with('-') { -1 } else { 1 };
            let oh: i64 = tz.get(1..3)?.parse().ok()?;
            let om: i64 = tz.get(4..6)?.parse().ok()?;
            sign * (oh * 3600 + om * 60)
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3600 + mi * 60 + se - offset;
    Some(secs * 1000 + ms)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Milliseconds of a Prometheus duration parameter (`15s`, `1h30m`, or float seconds).
pub fn parse_duration(name: &str, s: &str) -> Result<i64> {
    let err = || {
        bad(format!(
            "invalid parameter \"{name}\": cannot parse \"{s}\" to a valid duration"
        ))
    };
    if let Ok(f) = s.parse::<f64>() {
        let ms = f * 1000.0;
        if !ms.is_finite() || ms.abs() > 9.2e18 {
            return Err(err());
        }
        return Ok(ms.round() as i64);
    }
    prom_duration(s).ok_or_else(err)
}

/// Prometheus's duration syntax: units y, w, d, h, m, s, ms, each at most once, largest first.
pub fn prom_duration(s: &str) -> Option<i64> {
    if s.is_empty() {
        return None;
    }
    let units: [(&str, i64); 7] = [
        ("y", 365 * 86_400_000),
        ("w", 7 * 86_400_000),
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
        ("ms", 1),
    ];
    let mut rest = s;
    let mut total: i64 = 0;
    let mut last_unit = 0usize;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let n: i64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = if rest.starts_with("ms") {
            "ms"
        } else {
            rest.get(..1)?
        };
        let pos = units.iter().position(|(u, _)| *u == unit)?;
        if pos < last_unit || (total > 0 && pos == last_unit) {
            return None;
        }
        last_unit = pos;
        total = total.checked_add(n.checked_mul(units[pos].1)?)?;
        rest = &rest[unit.len()..];
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_durations_as_prometheus_reads_them() {
        assert_eq!(
            parse_time("t", "1700000000.123").ok(),
            Some(1_700_000_000_123)
        );
        assert_eq!(parse_time("t", "1700000000").ok(), Some(1_700_000_000_000));
        assert_eq!(
            parse_time("t", "2023-11-14T22:13:20.5Z").ok(),
            Some(1_700_000_000_500)
        );
        assert_eq!(
            parse_time("t", "2023-11-14T23:13:20+01:00").ok(),
            Some(1_700_000_000_000)
        );
        assert!(parse_time("t", "yesterday").is_err());
        assert_eq!(parse_duration("step", "15s").ok(), Some(15_000));
        assert_eq!(parse_duration("step", "1h30m").ok(), Some(5_400_000));
        assert_eq!(parse_duration("step", "0.5").ok(), Some(500));
        assert_eq!(parse_duration("step", "60").ok(), Some(60_000));
        assert!(parse_duration("step", "5x").is_err());
        assert!(parse_duration("step", "1m1h").is_err());
    }

    #[test]
    fn body_and_query_string_both_count() {
        let p = Params::parse(
            Some("match[]=up&start=1"),
            Some(b"query=sum%28up%29&match[]=x"),
        );
        assert_eq!(p.get("query"), Some("sum(up)"));
        assert_eq!(p.all("match[]"), vec!["x", "up"]);
        assert_eq!(p.get("start"), Some("1"));
    }
}
