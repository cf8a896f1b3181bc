//! What a question's filters say about the jobs it can return: the bounds the ledger's views
//! read from the filters DataFusion offers them (`supports_filters_pushdown` answers `Inexact`,
//! so every filter is still applied to the view's rows: a bound only has to be wide enough).
//!
//! | view | filter | bound |
//! | --- | --- | --- |
//! | `jobs` | `last_seen >= t`, `> t`, `BETWEEN t AND …` | `low` |
//! | `jobs` | `first_seen <= t`, `< t` | `high` |
//! | `jobs` | `last_seen <= t`, `< t`, `BETWEEN … AND t` | `last_high` |
//! | `job_groups` | `day >= t`, `> t`, `<= t`, `< t`, `BETWEEN` | `low`, `last_high` (the end of `t`'s day) |
//! | `job_hours` | `hour >= t`, `> t`, `<= t`, `< t`, `BETWEEN` | `low`, `high` |
//! | `job_days` | `day >= t`, `> t`, `<= t`, `< t`, `BETWEEN` | `low`, `high` (the end of `t`'s day) |
//! | both | `job_id = 'x'`, `job_id IN ('x', …)` | `jobs` |
//!
//! `t` is any expression without columns (`to_timestamp_nanos(…)`, `now() - INTERVAL …`, a
//! timestamp string), evaluated once. Anything else is left to the view's rows.

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Schema, TimeUnit};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::error::Result as DfResult;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{Between, BinaryExpr, Expr, Operator};
use std::sync::Arc;

use super::HOUR;
use super::view::View;

/// The bounds of a question on the jobs a view may return (nanoseconds).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Ask {
    /// The job's rows reach this time (`jobs`: last seen at or after; `job_hours`: an hour at
    /// or after).
    pub(super) low: Option<i64>,
    /// The job's rows start by this time (`jobs`: first seen at or before; `job_hours`: an hour
    /// at or before).
    pub(super) high: Option<i64>,
    /// `jobs`: the job was last seen at or before this time (so were all its rows; a job
    /// with raw samples after the watermark is not, when this is before it).
    pub(super) last_high: Option<i64>,
    /// Only these jobs.
    pub(super) jobs: Option<Vec<String>>,
}

impl Ask {
    /// Whether anything bounds the jobs.
    pub(super) fn bounded(&self) -> bool {
        self.low.is_some() || self.high.is_some() || self.last_high.is_some() || self.jobs.is_some()
    }

    /// Whether a job whose ledger hours are `first..=last` may be returned (`live`: it has raw
    /// samples after the ledger, so its rows reach the present).
    pub(super) fn may_return(&self, (first, last): (i64, i64), live: bool) -> bool {
        let reaches = live || self.low.is_none_or(|l| last + HOUR > l);
        let starts = self.high.is_none_or(|h| first <= h);
        // A job last seen by `h` had its last ledger hour start by then, unless it runs on.
        let ends = self
            .last_high
            .is_none_or(|h| first <= h && (live || last <= h));
        reaches && starts && ends
    }

    /// Whether every row `view` may return for the question lies before the raw samples at or
    /// after the watermark `w`: a `job_hours` or `job_days` question bounded before `w`'s hour
    /// (day) needs none of them, so neither their jobs nor their per-GPU intervals are read
    /// (a statement for a past month, the first and the whole days of a range). `jobs` rows
    /// run to the job's last sample, so a bound on `first_seen` never rules them out.
    pub(super) fn ends_before_raw(&self, view: View, w: i64) -> bool {
        let first_raw = match view {
            View::Hours => super::floor_hour(w),
            View::Days | View::Spend => super::days::floor_day(w),
            // A job with raw samples after the watermark was last seen at or after it.
            View::Jobs | View::Groups => return self.last_high.is_some_and(|h| h < w),
        };
        self.high.is_some_and(|h| h < first_raw)
    }

    /// The bounds `filters` put on `view`'s jobs, evaluating constant sides in `state`.
    pub(super) fn of(view: View, filters: &[Expr], state: &SessionState) -> Self {
        let (low_col, high_col) = match view {
            View::Jobs => ("last_seen", "first_seen"),
            View::Hours => ("hour", "hour"),
            View::Days | View::Spend | View::Groups => ("day", "day"),
        };
        let mut ask = Ask::default();
        for f in filters {
            ask.read(f, low_col, high_col, state);
        }
        let end_of_day = |h: i64| super::days::floor_day(h).saturating_add(super::days::DAY - 1);
        match view {
            // A day at or before `t` holds hours up to the end of `t`'s day.
            View::Days | View::Spend => ask.high = ask.high.map(end_of_day),
            // `job_groups`' day is the day its jobs were last seen.
            View::Groups => ask.last_high = ask.high.take().map(end_of_day),
            View::Jobs | View::Hours => {}
        }
        ask
    }

    fn read(&mut self, f: &Expr, low_col: &str, high_col: &str, state: &SessionState) {
        match f {
            Expr::BinaryExpr(BinaryExpr { left, op, right }) if *op == Operator::And => {
                self.read(left, low_col, high_col, state);
                self.read(right, low_col, high_col, state);
            }
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
                let (col, op, value) = match (column(left), column(right)) {
                    (Some(c), None) => (c, *op, right.as_ref()),
                    (None, Some(c)) => match op.swap() {
                        Some(op) => (c, op, left.as_ref()),
                        None => return,
                    },
                    _ => return,
                };
                self.compare(col, op, value, low_col, high_col, state);
            }
            Expr::Between(Between {
                expr,
                negated: false,
                low,
                high,
            }) => {
                if let Some(c) = column(expr) {
                    self.compare(c, Operator::GtEq, low, low_col, high_col, state);
                    self.compare(c, Operator::LtEq, high, low_col, high_col, state);
                }
            }
            Expr::InList(list) if !list.negated && column(&list.expr) == Some("job_id") => {
                let ids: Option<Vec<String>> = list.list.iter().map(text).collect();
                if let Some(ids) = ids {
                    self.only(ids);
                }
            }
            _ => {}
        }
    }

    fn compare(
        &mut self,
        col: &str,
        op: Operator,
        value: &Expr,
        low_col: &str,
        high_col: &str,
        state: &SessionState,
    ) {
        if col == "job_id" && op == Operator::Eq {
            if let Some(id) = text(value) {
                self.only(vec![id]);
            }
            return;
        }
        let is_low = col == low_col && matches!(op, Operator::Gt | Operator::GtEq);
        let is_high = col == high_col && matches!(op, Operator::Lt | Operator::LtEq);
        // `jobs` only: its `last_seen` is the low column.
        let is_last_high =
            col == "last_seen" && low_col == col && matches!(op, Operator::Lt | Operator::LtEq);
        if !(is_low || is_high || is_last_high) {
            return;
        }
        let Some(t) = nanos(value, state) else {
            return;
        };
        // A strict bound excludes its own instant (`day < midnight` ends the day before).
        let t = match op {
            Operator::Lt => t.saturating_sub(1),
            Operator::Gt => t.saturating_add(1),
            _ => t,
        };
        if is_low {
            self.low = Some(self.low.map_or(t, |l| l.max(t)));
        } else if is_last_high {
            self.last_high = Some(self.last_high.map_or(t, |h| h.min(t)));
        } else {
            self.high = Some(self.high.map_or(t, |h| h.min(t)));
        }
    }

    fn only(&mut self, ids: Vec<String>) {
        self.jobs = Some(match self.jobs.take() {
            Some(have) => have.into_iter().filter(|j| ids.contains(j)).collect(),
            None => ids,
        });
    }
}

/// The column `e` names, through casts.
fn column(e: &Expr) -> Option<&str> {
    match e {
        Expr::Column(c) => Some(c.name.as_str()),
        Expr::Cast(c) => column(&c.expr),
        Expr::TryCast(c) => column(&c.expr),
        _ => None,
    }
}

/// A text literal.
fn text(e: &Expr) -> Option<String> {
    match e {
        Expr::Literal(v, _) => match v {
            ScalarValue::Utf8(Some(s))
            | ScalarValue::Utf8View(Some(s))
            | ScalarValue::LargeUtf8(Some(s)) => Some(s.clone()),
            _ => None,
        },
        Expr::Cast(c) => text(&c.expr),
        _ => None,
    }
}

/// The value of an expression without columns, as nanoseconds since the epoch.
fn nanos(e: &Expr, state: &SessionState) -> Option<i64> {
    if !e.column_refs().is_empty() {
        return None;
    }
    let value = evaluate(e, state).ok()?;
    let ts = value
        .cast_to(&DataType::Timestamp(TimeUnit::Nanosecond, None))
        .ok()?;
    match ts {
        ScalarValue::TimestampNanosecond(Some(t), _) => Some(t),
        _ => None,
    }
}

fn evaluate(e: &Expr, state: &SessionState) -> DfResult<ScalarValue> {
    let schema = DFSchema::empty();
    let physical = state.create_physical_expr(e.clone(), &schema)?;
    let one_row = RecordBatch::try_new_with_options(
        Arc::new(Schema::empty()),
        vec![],
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(1)),
    )?;
    match physical.evaluate(&one_row)? {
        datafusion::logical_expr::ColumnarValue::Scalar(s) => Ok(s),
        datafusion::logical_expr::ColumnarValue::Array(a) => ScalarValue::try_from_array(&a, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    /// The bounds of the `WHERE` of `sql` over a table shaped like `view`.
    async fn ask_of(view: View, cond: &str) -> Ask {
        let ctx = SessionContext::new();
        ctx.sql(
            "CREATE TABLE t (job_id VARCHAR, last_seen TIMESTAMP WITH TIME ZONE, \
             first_seen TIMESTAMP WITH TIME ZONE, hour TIMESTAMP WITH TIME ZONE, \
             day TIMESTAMP WITH TIME ZONE, cost_usd DOUBLE)",
        )
        .await
        .expect("create");
        let plan = ctx
            .sql(&format!("SELECT * FROM t WHERE {cond}"))
            .await
            .expect("plan")
            .into_optimized_plan()
            .expect("optimize");
        let mut filters = Vec::new();
        plan.apply(|p| {
            if let datafusion::logical_expr::LogicalPlan::Filter(f) = p {
                filters.push(f.predicate.clone());
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        })
        .expect("walk");
        Ask::of(view, &filters, &ctx.state())
    }

    use datafusion::common::tree_node::TreeNode;

    const T: i64 = 1_800_000_000_000_000_000;

    #[tokio::test]
    async fn the_filters_of_lists_statements_panels_and_reports_give_their_bounds() {
        let list = ask_of(
            View::Jobs,
            &format!("last_seen >= to_timestamp_nanos({T}) AND cost_usd > 0"),
        )
        .await;
        assert_eq!(
            list,
            Ask {
                low: Some(T),
                ..Ask::default()
            }
        );
        let panel = ask_of(
            View::Jobs,
            "last_seen BETWEEN '2027-01-15T08:00:00Z' AND '2027-01-16T08:00:00Z' AND first_seen <= '2027-01-16T08:00:00Z'",
        )
        .await;
        assert_eq!(panel.low, Some(T));
        assert_eq!(panel.high, Some(T + 24 * HOUR));
        assert_eq!(panel.last_high, Some(T + 24 * HOUR), "BETWEEN's end");
        let month = ask_of(
            View::Hours,
            &format!(
                "hour >= to_timestamp_nanos({T}) AND hour < to_timestamp_nanos({})",
                T + 720 * HOUR
            ),
        )
        .await;
        assert_eq!(
            (month.low, month.high),
            (Some(T), Some(T + 720 * HOUR - 1)),
            "a strict bound leaves out its own instant"
        );
        let one = ask_of(View::Jobs, "job_id = '42' AND (job_id IN ('42', '43'))").await;
        assert_eq!(one.jobs, Some(vec!["42".to_string()]));
        // Flipped sides, `now()`, an upper bound on the wrong column, an OR: what can be read.
        let flipped = ask_of(View::Jobs, &format!("to_timestamp_nanos({T}) < last_seen")).await;
        assert_eq!(flipped.low, Some(T + 1));
        let recent = ask_of(View::Jobs, "last_seen >= now() - INTERVAL '1 hour'").await;
        assert!(
            recent.low.is_some_and(|t| t > T - 365 * 24 * HOUR),
            "{recent:?}"
        );
        let ended = ask_of(View::Jobs, &format!("last_seen < to_timestamp_nanos({T})")).await;
        assert_eq!(
            ended,
            Ask {
                last_high: Some(T - 1),
                ..Ask::default()
            }
        );
        let wrong = ask_of(
            View::Jobs,
            &format!("first_seen >= to_timestamp_nanos({T})"),
        )
        .await;
        assert!(!wrong.bounded(), "{wrong:?}");
        // `job_groups`: a day at or before `t` holds jobs last seen up to the end of its day.
        let midnight = super::super::days::floor_day(T);
        let groups = ask_of(
            View::Groups,
            &format!("day >= to_timestamp_nanos({midnight}) AND day <= to_timestamp_nanos({T})"),
        )
        .await;
        let day = super::super::days::DAY;
        assert_eq!(
            (groups.low, groups.high, groups.last_high),
            (Some(midnight), None, Some(midnight + day - 1))
        );
        let either = ask_of(
            View::Jobs,
            &format!("last_seen >= to_timestamp_nanos({T}) OR job_id = '1'"),
        )
        .await;
        assert!(!either.bounded(), "{either:?}");
    }

    #[tokio::test]
    async fn a_question_that_ends_before_the_watermark_reads_no_raw_samples() {
        let w = T + 10 * HOUR;
        let at = |c: &str, t: i64| format!("{c} to_timestamp_nanos({t})");
        let hours = ask_of(View::Hours, &at("hour <", w)).await;
        assert!(hours.ends_before_raw(View::Hours, w), "{hours:?}");
        let hours = ask_of(View::Hours, &at("hour <=", w)).await;
        assert!(
            !hours.ends_before_raw(View::Hours, w),
            "the watermark's hour"
        );
        assert!(
            !hours.ends_before_raw(View::Hours, w - 1),
            "an hour with raw samples"
        );
        // Days: `day < midnight` ends the day before; `day <= midnight` holds that day.
        let midnight = super::super::days::floor_day(w);
        let days = ask_of(View::Days, &at("day <", midnight)).await;
        assert!(days.ends_before_raw(View::Days, w), "{days:?}");
        let days = ask_of(View::Days, &at("day <=", midnight)).await;
        assert!(!days.ends_before_raw(View::Days, w), "{days:?}");
        // A job first seen long ago may still be running.
        let jobs = ask_of(View::Jobs, &at("first_seen <=", T)).await;
        assert!(!jobs.ends_before_raw(View::Jobs, w));
        // A job last seen before the watermark has no raw samples after it.
        let ended = ask_of(View::Jobs, &at("last_seen <", w)).await;
        assert!(ended.ends_before_raw(View::Jobs, w), "{ended:?}");
        let ended = ask_of(View::Jobs, &at("last_seen <=", w)).await;
        assert!(!ended.ends_before_raw(View::Jobs, w), "{ended:?}");
        assert!(!Ask::default().ends_before_raw(View::Hours, w), "unbounded");
    }

    #[test]
    fn a_job_may_be_returned_when_its_hours_meet_the_bounds() {
        let ask = Ask {
            low: Some(10 * HOUR + 5),
            high: Some(20 * HOUR),
            ..Ask::default()
        };
        assert!(
            ask.may_return((0, 10 * HOUR), false),
            "last hour holds the bound"
        );
        assert!(!ask.may_return((0, 9 * HOUR), false));
        assert!(ask.may_return((0, 9 * HOUR), true), "running");
        assert!(ask.may_return((20 * HOUR, 30 * HOUR), false));
        assert!(!ask.may_return((21 * HOUR, 30 * HOUR), false));
        let ended = Ask {
            last_high: Some(10 * HOUR + 5),
            ..Ask::default()
        };
        assert!(ended.may_return((0, 10 * HOUR), false), "its last hour");
        assert!(!ended.may_return((0, 11 * HOUR), false), "seen after");
        assert!(
            ended.may_return((0, 11 * HOUR), true),
            "running: raw samples decide"
        );
        assert!(
            !ended.may_return((11 * HOUR, 11 * HOUR), true),
            "started after"
        );
    }
}
