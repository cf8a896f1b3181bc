//! The time limit, enforced inside a running plan.
//!
//! Dropping a query's stream stops it only where its operators yield to the runtime. Some do
//! not for a long time: a nested-loop join feeding an aggregation produces and consumes
//! millions of batches in one poll. So the engine's [`DeadlineRule`] wraps every operator of a
//! physical plan that can run long in a [`DeadlineExec`], whose stream checks the query's
//! deadline before and after each batch it passes on: past it, the batch becomes a
//! [`DeadlinePassed`] error (HTTP 504, Postgres 57014), and the operator above stops pulling. A
//! check is one clock read per batch. The deadline is the [`Deadline`] extension of the session
//! the plan runs in, set per query over HTTP and for alert rules, per statement over Postgres,
//! and left out for cursors; a session without one runs without.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::Stream;

/// A query stopped at its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadlinePassed(pub Duration);

impl fmt::Display for DeadlinePassed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "query ran longer than {:?}", self.0)
    }
}

impl std::error::Error for DeadlinePassed {}

impl DeadlinePassed {
    /// The [`DeadlinePassed`] at the root of `e`, if that is what it is.
    pub fn find(e: &DataFusionError) -> Option<DeadlinePassed> {
        match e.find_root() {
            DataFusionError::External(inner) => inner.downcast_ref::<DeadlinePassed>().copied(),
            _ => None,
        }
    }
}

/// When a query must stop, and the limit it was given (for the message).
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Instant,
    limit: Duration,
}

impl Deadline {
    /// `limit` from now.
    pub fn after(limit: Duration) -> Self {
        Self {
            at: Instant::now() + limit,
            limit,
        }
    }
}

/// Wraps the operators of `plan` that can run long without yielding (joins, aggregations,
/// sorts, windows, recursive queries, generators, unnest, unions) in [`DeadlineExec`]s.
pub fn wrap(plan: Arc<dyn ExecutionPlan>, deadline: Deadline) -> DfResult<Arc<dyn ExecutionPlan>> {
    wrap_with(plan, Some(deadline))
}

/// As [`wrap`]; with `None`, each [`DeadlineExec`] takes the [`Deadline`] of the session it is
/// executed in (a session config extension), and has none when the session has none.
fn wrap_with(
    plan: Arc<dyn ExecutionPlan>,
    deadline: Option<Deadline>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let name = node.name();
        let long = [
            "Join",
            "Aggregate",
            "Sort",
            "Window",
            "Recursive",
            "LazyMemory",
            "Unnest",
            "Union",
        ]
        .iter()
        .any(|n| name.contains(n));
        if long {
            Ok(Transformed::yes(Arc::new(DeadlineExec {
                input: node,
                deadline,
            }) as Arc<dyn ExecutionPlan>))
        } else {
            Ok(Transformed::no(node))
        }
    })
    .map(|t| t.data)
}

/// The physical optimizer rule that wraps plans in [`DeadlineExec`]s taking the deadline of the
/// session they run in (the Postgres front end: set for each statement, none for a cursor, whose
/// `FETCH`es are not bound by the time limit).
#[derive(Debug, Default)]
pub struct DeadlineRule;

impl datafusion::physical_optimizer::PhysicalOptimizerRule for DeadlineRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &datafusion::config::ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        wrap_with(plan, None)
    }

    fn name(&self) -> &str {
        "deadline"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Passes its input's batches on until the deadline.
#[derive(Debug)]
pub struct DeadlineExec {
    input: Arc<dyn ExecutionPlan>,
    deadline: Option<Deadline>,
}

impl DisplayAs for DeadlineExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match self.deadline {
            Some(d) => write!(f, "DeadlineExec: limit={:?}", d.limit),
            None => write!(f, "DeadlineExec: the session's"),
        }
    }
}

impl ExecutionPlan for DeadlineExec {
    fn name(&self) -> &str {
        "DeadlineExec"
    }

    // No expressions of its own.
    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let input = children
            .pop()
            .ok_or_else(|| DataFusionError::Internal("DeadlineExec takes one child".into()))?;
        Ok(Arc::new(DeadlineExec {
            input,
            deadline: self.deadline,
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let deadline = self.deadline.or_else(|| {
            context
                .session_config()
                .get_extension::<Deadline>()
                .map(|d| *d)
        });
        let input = self.input.execute(partition, context)?;
        let Some(deadline) = deadline else {
            return Ok(input);
        };
        Ok(Box::pin(DeadlineStream {
            input,
            deadline,
            done: false,
        }))
    }
}

struct DeadlineStream {
    input: SendableRecordBatchStream,
    deadline: Deadline,
    done: bool,
}

impl DeadlineStream {
    fn passed(&mut self) -> Option<DfResult<RecordBatch>> {
        if Instant::now() < self.deadline.at {
            return None;
        }
        self.done = true;
        Some(Err(DataFusionError::External(Box::new(DeadlinePassed(
            self.deadline.limit,
        )))))
    }
}

impl Stream for DeadlineStream {
    type Item = DfResult<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(e) = self.passed() {
            return Poll::Ready(Some(e));
        }
        match self.input.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(batch))) => match self.passed() {
                Some(e) => Poll::Ready(Some(e)),
                None => Poll::Ready(Some(Ok(batch))),
            },
            other => other,
        }
    }
}

impl RecordBatchStream for DeadlineStream {
    fn schema(&self) -> SchemaRef {
        self.input.schema()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;
    use futures::StreamExt;

    /// A query whose operators never yield (a cross join under an aggregation) stops at the
    /// deadline, with [`DeadlinePassed`].
    #[tokio::test]
    async fn a_long_join_stops_at_the_deadline() {
        let ctx = SessionContext::new();
        let df = ctx
            .sql("SELECT sum(a.value * b.value) FROM generate_series(1, 100000) a CROSS JOIN generate_series(1, 100000) b")
            .await
            .expect("plan");
        let plan = df.create_physical_plan().await.expect("physical plan");
        let limit = Duration::from_millis(300);
        let plan = wrap(plan, Deadline::after(limit)).expect("wrap");
        let shown = datafusion::physical_plan::displayable(plan.as_ref())
            .indent(false)
            .to_string();
        assert!(shown.contains("DeadlineExec"), "{shown}");
        let started = Instant::now();
        let mut stream =
            datafusion::physical_plan::execute_stream(plan, ctx.task_ctx()).expect("execute");
        let err = loop {
            match stream.next().await {
                Some(Err(e)) => break e,
                Some(Ok(_)) => continue,
                None => panic!("finished a 10^10-row join"),
            }
        };
        assert_eq!(
            DeadlinePassed::find(&err),
            Some(DeadlinePassed(limit)),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(20));
        let err = crate::Error::from(err);
        assert_eq!(err.status(), crate::Status::Timeout);
    }

    #[tokio::test]
    async fn answers_within_the_deadline_are_unchanged() {
        let ctx = SessionContext::new();
        let sql = "SELECT k, count(*) AS n FROM (SELECT value % 3 AS k FROM generate_series(1, 1000)) GROUP BY k ORDER BY k";
        let plan = ctx
            .sql(sql)
            .await
            .expect("plan")
            .create_physical_plan()
            .await
            .expect("physical plan");
        let plan = wrap(plan, Deadline::after(Duration::from_secs(60))).expect("wrap");
        let batches = datafusion::physical_plan::collect(plan, ctx.task_ctx())
            .await
            .expect("collect");
        let text = arrow::util::pretty::pretty_format_batches(&batches)
            .expect("format")
            .to_string();
        assert!(text.contains("| 0 | 333 |"), "{text}");
        assert!(text.contains("| 1 | 334 |"), "{text}");
    }
}
