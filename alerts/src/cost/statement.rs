//! Monthly statements: GPU-hours, idle GPU-hours, energy, cost, idle cost and work done per
//! account, user, namespace, partition or pod label, and GPU model, summed from the
//! `job_days` view over the days of one calendar month (UTC). `GET /api/v1/cost` and
//! `gpuwatch cost` answer with [`Statement::sql`] (docs/cost.md "Statements").

use std::fmt;
use std::str::FromStr;

use chrono::{Datelike, NaiveDate, TimeZone, Utc};

use super::sql_str;
use crate::error::{Error, Result};

/// What a statement groups by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupBy {
    /// `job_account`: the Slurm account.
    Account,
    /// `job_user`.
    User,
    /// `k8s_namespace`.
    Namespace,
    /// `job_partition`: the Slurm partition.
    Partition,
    /// One pod label of `job_labels` (the agent's `--pod-label`).
    Label(String),
}

impl GroupBy {
    /// The column of the statement that holds the group.
    pub fn column(&self) -> String {
        match self {
            GroupBy::Account => "account".into(),
            GroupBy::User => "user".into(),
            GroupBy::Namespace => "namespace".into(),
            GroupBy::Partition => "partition".into(),
            GroupBy::Label(name) => format!("label:{name}"),
        }
    }

    /// The SQL of the group over a `job_days` row.
    fn expr(&self) -> String {
        match self {
            GroupBy::Account => "job_account".into(),
            GroupBy::User => "job_user".into(),
            GroupBy::Namespace => "k8s_namespace".into(),
            GroupBy::Partition => "job_partition".into(),
            // Label names are checked to hold no character special to a regex but `.`.
            GroupBy::Label(name) => format!(
                "regexp_match(job_labels, {})[1]",
                sql_str(&format!("(?:^|,){}=([^,]*)", name.replace('.', "\\.")))
            ),
        }
    }
}

impl FromStr for GroupBy {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "account" => Ok(GroupBy::Account),
            "user" => Ok(GroupBy::User),
            "namespace" => Ok(GroupBy::Namespace),
            "partition" => Ok(GroupBy::Partition),
            _ => match s.strip_prefix("label:") {
                Some(name) if valid_label(name) => Ok(GroupBy::Label(name.to_string())),
                Some(name) => Err(Error::Config(format!(
                    "by: {name:?} is not a pod label name (letters, digits, '-', '_', '.', '/')"
                ))),
                None => Err(Error::Config(format!(
                    "by: {s:?}: group by account, user, namespace, partition or label:NAME"
                ))),
            },
        }
    }
}

/// A Kubernetes label name: at most 317 characters of letters, digits, `-`, `_`, `.`, `/`.
fn valid_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 317
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

/// A calendar month, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Month {
    first: NaiveDate,
}

impl Month {
    /// The month `unix_nanos` falls in.
    pub fn of(unix_nanos: i64) -> Self {
        let day = Utc.timestamp_nanos(unix_nanos).date_naive();
        Month {
            first: day.with_day(1).unwrap_or(day),
        }
    }

    /// Its first instant and the first instant of the next month, Unix nanoseconds.
    pub fn range_nanos(&self) -> (i64, i64) {
        let next = self
            .first
            .checked_add_months(chrono::Months::new(1))
            .unwrap_or(NaiveDate::MAX);
        let nanos = |d: NaiveDate| {
            d.and_hms_opt(0, 0, 0)
                .and_then(|t| t.and_utc().timestamp_nanos_opt())
                .unwrap_or(i64::MAX)
        };
        (nanos(self.first), nanos(next))
    }
}

impl fmt::Display for Month {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}", self.first.year(), self.first.month())
    }
}

impl FromStr for Month {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::Config(format!(
                "month: {s:?}: give a month as YYYY-MM, e.g. 2026-11"
            ))
        };
        let (y, m) = s.split_once('-').ok_or_else(bad)?;
        if y.len() != 4 || m.len() != 2 {
            return Err(bad());
        }
        let (y, m) = (
            y.parse::<i32>().map_err(|_| bad())?,
            m.parse::<u32>().map_err(|_| bad())?,
        );
        let first = NaiveDate::from_ymd_opt(y, m, 1).ok_or_else(bad)?;
        // Timestamps are nanoseconds since 1970 in 64 bits: 1970 to 2261.
        if !(1970..=2261).contains(&y) {
            return Err(bad());
        }
        Ok(Month { first })
    }
}

/// One statement: a month grouped one way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// The grouping.
    pub by: GroupBy,
    /// The month.
    pub month: Month,
}

impl Statement {
    /// The statement's SQL over `job_days`: one row per group and GPU model with `month`,
    /// the group's column ([`GroupBy::column`], null for jobs without it), `gpu_model`, `jobs`,
    /// `gpu_hours`, `idle_gpu_hours`, `energy_kwh`, `cost_usd`, `idle_cost_usd`, `work_unit`
    /// and `work_done` (both null unless every job of the row that reports work uses one
    /// unit), most costly first.
    pub fn sql(&self) -> String {
        let (start, end) = self.month.range_nanos();
        format!(
            r#"SELECT {month} AS month, g AS "{column}", gpu_model, count(DISTINCT job_id) AS jobs,
  sum(gpu_seconds) / 3600.0 AS gpu_hours, sum(idle_gpu_seconds) / 3600.0 AS idle_gpu_hours,
  sum(energy_joules) / 3.6e6 AS energy_kwh, sum(cost_usd) AS cost_usd, sum(idle_cost_usd) AS idle_cost_usd,
  CASE WHEN count(DISTINCT work_unit) = 1 THEN max(work_unit) END AS work_unit,
  CASE WHEN count(DISTINCT work_unit) = 1 THEN sum(work_done) END AS work_done
FROM (SELECT {group} AS g, * FROM job_days
      WHERE day >= to_timestamp_nanos({start}) AND day < to_timestamp_nanos({end})) h
GROUP BY g, gpu_model ORDER BY cost_usd DESC, g, gpu_model"#,
            month = sql_str(&self.month.to_string()),
            column = self.by.column().replace('"', ""),
            group = self.by.expr(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_parse_to_their_utc_range_and_bad_ones_are_refused() {
        let m: Month = "2026-11".parse().expect("month");
        assert_eq!(m.to_string(), "2026-11");
        assert_eq!(
            m.range_nanos(),
            (1_793_491_200_000_000_000, 1_796_083_200_000_000_000)
        );
        let dec: Month = "2026-12".parse().expect("december");
        assert_eq!(dec.range_nanos().1, 1_798_761_600_000_000_000);
        assert_eq!(
            Month::of(1_793_491_200_000_000_000 - 1).to_string(),
            "2026-10"
        );
        for bad in [
            "2026-13", "2026-1", "26-11", "2026/11", "", "1969-12", "2262-01", "x-yy",
        ] {
            let e = bad.parse::<Month>().expect_err(bad).to_string();
            assert!(e.contains("YYYY-MM"), "{bad}: {e}");
        }
    }

    #[test]
    fn groupings_parse_and_label_names_are_checked() {
        assert_eq!("account".parse::<GroupBy>().expect("a"), GroupBy::Account);
        let l: GroupBy = "label:app.kubernetes.io/team".parse().expect("label");
        assert_eq!(l.column(), "label:app.kubernetes.io/team");
        assert!(
            l.expr().contains(r"app\.kubernetes\.io/team=([^,]*)"),
            "{}",
            l.expr()
        );
        for bad in [
            "label:",
            "label:a'b",
            "label:a b",
            "label:(x)",
            "cost",
            "Account",
        ] {
            assert!(bad.parse::<GroupBy>().is_err(), "{bad}");
        }
    }
}
