//! Durations as settings write them: `500ms`, `5s`, `1m30s`, `7d` (humantime).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Parses a duration such as `5s`, `1m30s`, `250ms`, with a message that says how to write one.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("invalid duration {s:?} ({e}): use e.g. 5s, 1m, 250ms"))
}

/// A duration read from a flag, a variable or the config file as text (`"5s"`), and written
/// back the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    /// The duration.
    pub fn get(self) -> Duration {
        self.0
    }
}

impl From<Duration> for HumanDuration {
    fn from(d: Duration) -> Self {
        Self(d)
    }
}

impl FromStr for HumanDuration {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        parse_duration(s).map(Self)
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trip() {
        let d: HumanDuration = "1m30s".parse().expect("parse");
        assert_eq!(d.get(), Duration::from_secs(90));
        assert_eq!(d.to_string(), "1m 30s");
        let back: HumanDuration = d.to_string().parse().expect("reparse");
        assert_eq!(back, d);
        let e = "soon".parse::<HumanDuration>().expect_err("bad");
        assert!(e.contains("use e.g. 5s"), "{e}");
    }
}
