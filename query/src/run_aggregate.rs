//! Partial aggregation that looks groups up once per run of equal keys.
//!
//! The store writes every Parquet file sorted by host, GPU and time, so a scan yields long runs
//! of rows that share their labels: a GPU's rows of one hour follow each other. DataFusion's hash
//! aggregation hashes and compares every row's group keys; with 40-byte GPU UUIDs that is most
//! of the time of a query such as GPU-hours per job. [`RunAggregateExec`] compares each row's
//! keys with the previous row's instead (for a string read as a view: one 16-byte comparison
//! when both come from the same dictionary page), and looks a group up only where the keys
//! change: the first row of each run goes through DataFusion's own group table, and the
//! aggregate functions are DataFusion's own groups accumulators, called with the group index of
//! every row, so every aggregate gives the same answer as through DataFusion's operator.
//!
//! [`RunAggregateRule`] puts it in place of a partial `AggregateExec` when it can stand in for it
//! exactly: a plain `GROUP BY` (no grouping sets) on keys of the types below, aggregates with
//! groups accumulators (no `DISTINCT`, no `ORDER BY` within the aggregate), no limit pushed into
//! the aggregation, unordered input. Any other aggregation is left to DataFusion, and so is a
//! query that reads a single partition (DataFusion then aggregates in one step, which can spill).
//!
//! Where runs are shorter than two rows on average, rows go to the group table directly (the
//! cost of a hash aggregation), and every 16th batch looks for runs again. Like DataFusion's
//! partial aggregation, it passes rows on as one-row states once its probe finds about as many
//! groups as rows, and emits what it holds and starts again when the query's memory pool refuses
//! it more memory: the final aggregation merges the partial states.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, AsArray, BooleanArray, RecordBatch, UInt32Array};
use arrow::compute::take;
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::group_values::{GroupValues, new_group_values};
use datafusion::physical_plan::aggregates::order::GroupOrdering;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::execution_plan::CardinalityEffect;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildStats, DisplayAs, DisplayFormatType, ExecutionPlan, InputDistributionRequirements,
    InputOrderMode, PhysicalExpr, PlanProperties, Statistics, StatisticsArgs,
};
use futures::StreamExt;

/// Puts [`RunAggregateExec`] in place of the partial aggregations it can compute.
#[derive(Debug, Default)]
pub struct RunAggregateRule;

impl PhysicalOptimizerRule for RunAggregateRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            if let Some(agg) = node.downcast_ref::<AggregateExec>() {
                if eligible(agg) {
                    let run: Arc<dyn ExecutionPlan> =
                        Arc::new(RunAggregateExec::new(Arc::new(agg.clone())));
                    return Ok(Transformed::yes(run));
                }
            }
            Ok(Transformed::no(node))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "run_aggregate"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Whether [`RunAggregateExec`] computes exactly what `agg` does.
fn eligible(agg: &AggregateExec) -> bool {
    let group_by = agg.group_expr();
    if *agg.mode() != AggregateMode::Partial
        || !group_by.is_single()
        || group_by.expr().is_empty()
        || agg.limit_options().is_some()
        || !agg.dynamic_expressions_produced().is_empty()
        || *agg.input_order_mode() != InputOrderMode::Linear
    {
        return false;
    }
    let aggregates_fit = agg
        .aggr_expr()
        .iter()
        .all(|a| a.order_bys().is_empty() && !a.is_distinct() && a.groups_accumulator_supported());
    let input = agg.input_schema();
    let keys_fit = group_by.expr().iter().all(|(expr, _)| {
        expr.data_type(&input)
            .map(|t| comparable(&t))
            .unwrap_or(false)
    });
    aggregates_fit && keys_fit
}

/// Key types whose runs [`mark_changes`] finds.
fn comparable(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Null
            | DataType::Boolean
            | DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::Utf8View
            | DataType::BinaryView
    ) || t.primitive_width().is_some()
}

/// A partial aggregation over runs of equal group keys (see the module's documentation). It
/// holds the `AggregateExec` it stands for: its expressions, schema and plan properties.
#[derive(Debug)]
pub struct RunAggregateExec {
    agg: Arc<AggregateExec>,
    metrics: ExecutionPlanMetricsSet,
}

impl RunAggregateExec {
    fn new(agg: Arc<AggregateExec>) -> Self {
        Self {
            agg,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for RunAggregateExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        struct Inner<'a>(&'a AggregateExec, DisplayFormatType);
        impl fmt::Display for Inner<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt_as(self.1, f)
            }
        }
        let inner = Inner(&self.agg, t).to_string();
        let rest = inner.strip_prefix("AggregateExec: ").unwrap_or(&inner);
        match t {
            DisplayFormatType::TreeRender => write!(f, "{rest}"),
            _ => write!(f, "RunAggregateExec: {rest}"),
        }
    }
}

impl ExecutionPlan for RunAggregateExec {
    fn name(&self) -> &str {
        "RunAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.agg.properties()
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        self.agg.input_distribution_requirements()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.agg.input()]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let agg = Arc::clone(&self.agg) as Arc<dyn ExecutionPlan>;
        let agg = agg.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )?;
        match agg.downcast_ref::<AggregateExec>() {
            Some(a) if eligible(a) => Ok(Arc::new(Self::new(Arc::new(a.clone())))),
            _ => Ok(agg),
        }
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        self.agg.apply_expressions(f)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.agg.input().execute(partition, Arc::clone(&context))?;
        let options = &context.session_config().options().execution;
        let probe = Probe {
            rows: options.skip_partial_aggregation_probe_rows_threshold,
            ratio: options.skip_partial_aggregation_probe_ratio_threshold,
            seen: 0,
            skipped: MetricBuilder::new(&self.metrics)
                .counter("skipped_aggregation_rows", partition),
        };
        let groups = Groups::try_new(&self.agg, context.session_config().batch_size(), probe)?;
        let reservation = MemoryConsumer::new(format!("RunAggregateExec[{partition}]"))
            .register(context.memory_pool());
        let schema = self.schema();
        let state = StreamState {
            input,
            groups,
            reservation,
            pending: VecDeque::new(),
            done: false,
            metrics: BaselineMetrics::new(&self.metrics, partition),
        };
        let stream = futures::stream::unfold(state, next_batch);
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        self.agg.child_stats_requests(partition)
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        self.agg.statistics_from_inputs(input_stats, args)
    }

    fn cardinality_effect(&self) -> CardinalityEffect {
        self.agg.cardinality_effect()
    }
}

struct StreamState {
    input: SendableRecordBatchStream,
    groups: Groups,
    reservation: MemoryReservation,
    pending: VecDeque<RecordBatch>,
    done: bool,
    metrics: BaselineMetrics,
}

async fn next_batch(mut s: StreamState) -> Option<(Result<RecordBatch>, StreamState)> {
    loop {
        if let Some(batch) = s.pending.pop_front() {
            s.metrics.record_output(batch.num_rows());
            return Some((Ok(batch), s));
        }
        if s.done {
            s.metrics.done();
            return None;
        }
        let step = match s.input.next().await {
            Some(Ok(batch)) => {
                let _timer = s.metrics.elapsed_compute().timer();
                s.groups
                    .update(&batch, &mut s.pending)
                    .and_then(|()| s.groups.fit(&mut s.reservation, &mut s.pending))
            }
            Some(Err(e)) => Err(e),
            None => {
                s.done = true;
                let _timer = s.metrics.elapsed_compute().timer();
                let emitted = s.groups.emit(&mut s.pending);
                s.reservation.free();
                emitted
            }
        };
        if let Err(e) = step {
            s.done = true;
            s.pending.clear();
            return Some((Err(e), s));
        }
    }
}

/// The groups of one partition: their keys, in DataFusion's own group table (which hashes the
/// first row of each run), and the accumulators' state.
struct Groups {
    keys: Vec<Arc<dyn PhysicalExpr>>,
    args: Vec<Vec<Arc<dyn PhysicalExpr>>>,
    filters: Vec<Option<Arc<dyn PhysicalExpr>>>,
    accumulators: Vec<Box<dyn GroupsAccumulator>>,
    values: Box<dyn GroupValues>,
    schema: SchemaRef,
    batch_size: usize,
    probe: Probe,
    /// Set once the probe found about as many groups as rows: rows then pass through as
    /// partial states of one row each.
    passing: bool,
    /// The last batch that was looked at had runs of under two rows on average.
    short_runs: bool,
    batches: u64,
    // Scratch space, kept between batches.
    same: Vec<bool>,
    starts: Vec<u32>,
    group_of_start: Vec<usize>,
    group_of_row: Vec<usize>,
}

impl Groups {
    fn try_new(agg: &AggregateExec, batch_size: usize, probe: Probe) -> Result<Self> {
        let group_schema = agg.group_expr().group_schema(&agg.input_schema())?;
        let accumulators = agg
            .aggr_expr()
            .iter()
            .map(|a| a.create_groups_accumulator())
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            keys: agg
                .group_expr()
                .expr()
                .iter()
                .map(|(e, _)| Arc::clone(e))
                .collect(),
            args: agg.aggr_expr().iter().map(|a| a.expressions()).collect(),
            filters: agg.filter_expr().to_vec(),
            accumulators,
            values: new_group_values(group_schema, &GroupOrdering::None)?,
            schema: agg.schema(),
            batch_size: batch_size.max(1),
            probe,
            passing: false,
            short_runs: false,
            batches: 0,
            same: Vec::new(),
            starts: Vec::new(),
            group_of_start: Vec::new(),
            group_of_row: Vec::new(),
        })
    }

    /// Adds the rows of `batch` to their groups (or, once passing, turns them into states).
    fn update(&mut self, batch: &RecordBatch, out: &mut VecDeque<RecordBatch>) -> Result<()> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let keys = self
            .keys
            .iter()
            .map(|e| e.evaluate(batch).and_then(|v| v.into_array(n)))
            .collect::<Result<Vec<_>>>()?;
        if self.passing {
            return self.pass(batch, keys, out);
        }

        // Where runs are short, every row goes to the group table; every 16th batch looks
        // for runs again.
        self.batches += 1;
        if self.short_runs && self.batches % 16 != 0 {
            self.values.intern(&keys, &mut self.group_of_row)?;
        } else {
            self.group_runs(keys, n)?;
        }

        let total = self.values.len();
        for i in 0..self.accumulators.len() {
            let (values, filter) = self.arguments(i, batch)?;
            let filter = boolean(filter.as_ref())?;
            self.accumulators[i].update_batch(&values, &self.group_of_row, filter, total)?;
        }

        // Like DataFusion's partial aggregation: when the first rows hold about as many groups
        // as rows, aggregating them here only costs; emit what is held and pass rows on.
        if self.probe.passes(n, self.values.len()) {
            self.passing = true;
            self.emit(out)?;
        }
        Ok(())
    }

    /// Sets `group_of_row` from the group of the first row of each run of equal keys.
    fn group_runs(&mut self, keys: Vec<arrow::array::ArrayRef>, n: usize) -> Result<()> {
        // Where a run starts: at the first row, and wherever a key changes.
        self.same.clear();
        self.same.resize(n, true);
        self.same[0] = false;
        for key in &keys {
            mark_changes(key.as_ref(), &mut self.same)?;
        }
        self.starts.clear();
        self.starts.extend(
            self.same
                .iter()
                .enumerate()
                .filter(|(_, same)| !**same)
                .map(|(i, _)| i as u32),
        );
        // Runs shorter than two rows on average save less than finding them costs.
        self.short_runs = self.starts.len() * 2 > n;

        let firsts = if self.starts.len() == n {
            keys
        } else {
            let idx = UInt32Array::from(self.starts.clone());
            keys.iter()
                .map(|k| take(k.as_ref(), &idx, None).map_err(DataFusionError::from))
                .collect::<Result<Vec<_>>>()?
        };
        self.values.intern(&firsts, &mut self.group_of_start)?;
        self.group_of_row.clear();
        for (r, group) in self.group_of_start.iter().enumerate() {
            let end = self.starts.get(r + 1).map_or(n, |s| *s as usize);
            let len = end - self.starts[r] as usize;
            self.group_of_row.extend(std::iter::repeat_n(*group, len));
        }
        Ok(())
    }

    /// The arguments and filter of aggregate `i` over `batch`.
    fn arguments(
        &self,
        i: usize,
        batch: &RecordBatch,
    ) -> Result<(Vec<arrow::array::ArrayRef>, Option<arrow::array::ArrayRef>)> {
        let n = batch.num_rows();
        let values = self.args[i]
            .iter()
            .map(|e| e.evaluate(batch).and_then(|v| v.into_array(n)))
            .collect::<Result<Vec<_>>>()?;
        let filter = match &self.filters[i] {
            Some(f) => Some(f.evaluate(batch).and_then(|v| v.into_array(n))?),
            None => None,
        };
        Ok((values, filter))
    }

    /// Every row of `batch` as a partial state of its own.
    fn pass(
        &mut self,
        batch: &RecordBatch,
        mut columns: Vec<arrow::array::ArrayRef>,
        out: &mut VecDeque<RecordBatch>,
    ) -> Result<()> {
        for i in 0..self.accumulators.len() {
            let (values, filter) = self.arguments(i, batch)?;
            let filter = boolean(filter.as_ref())?;
            columns.extend(self.accumulators[i].convert_to_state(&values, filter)?);
        }
        out.push_back(RecordBatch::try_new(Arc::clone(&self.schema), columns)?);
        self.probe.skipped.add(batch.num_rows());
        Ok(())
    }

    /// The memory held, as counted in the query's memory pool.
    fn size(&self) -> usize {
        self.values.size()
            + self.accumulators.iter().map(|a| a.size()).sum::<usize>()
            + self.same.capacity()
            + self.starts.capacity() * size_of::<u32>()
            + (self.group_of_start.capacity() + self.group_of_row.capacity()) * size_of::<usize>()
    }

    /// Accounts for the memory held; when the pool refuses it, emits every group into `out`
    /// (the final aggregation merges them with later ones) and starts again.
    fn fit(
        &mut self,
        reservation: &mut MemoryReservation,
        out: &mut VecDeque<RecordBatch>,
    ) -> Result<()> {
        if reservation.try_resize(self.size()).is_ok() {
            return Ok(());
        }
        self.emit(out)?;
        self.values.clear_shrink(0);
        self.group_of_start = Vec::new();
        self.group_of_row = Vec::new();
        self.same = Vec::new();
        self.starts = Vec::new();
        reservation.try_resize(self.size())
    }

    /// Moves every group, keys and accumulator states, into `out` and starts again.
    fn emit(&mut self, out: &mut VecDeque<RecordBatch>) -> Result<()> {
        let n = self.values.len();
        if n == 0 {
            return Ok(());
        }
        let mut columns = self.values.emit(EmitTo::All)?;
        for acc in &mut self.accumulators {
            columns.extend(acc.state(EmitTo::All)?);
        }
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), columns)?;
        let mut offset = 0;
        while offset < n {
            let len = self.batch_size.min(n - offset);
            out.push_back(batch.slice(offset, len));
            offset += len;
        }
        Ok(())
    }
}

/// DataFusion's test for skipping partial aggregation: after `rows` input rows, more than
/// `ratio` groups per row.
struct Probe {
    rows: usize,
    ratio: f64,
    seen: usize,
    /// Rows passed on without aggregation (shown by `EXPLAIN ANALYZE`).
    skipped: Count,
}

impl Probe {
    fn passes(&mut self, rows: usize, groups: usize) -> bool {
        self.seen += rows;
        self.seen >= self.rows && groups as f64 / self.seen as f64 > self.ratio
    }
}

fn boolean(filter: Option<&arrow::array::ArrayRef>) -> Result<Option<&BooleanArray>> {
    match filter {
        Some(f) => f.as_boolean_opt().map(Some).ok_or_else(|| {
            DataFusionError::Internal(format!(
                "aggregate filter is {}, not a boolean",
                f.data_type()
            ))
        }),
        None => Ok(None),
    }
}

/// Clears `same[i]` where row `i` of `array` may differ from row `i - 1`. A row is kept only
/// when it surely equals the one before; a run split where it need not be costs a lookup, never
/// a wrong answer.
fn mark_changes(array: &dyn Array, same: &mut [bool]) -> Result<()> {
    let n = array.len();
    match array.data_type() {
        DataType::Null => return Ok(()),
        DataType::Utf8View => {
            let a = array.as_string_view();
            mark_views(a.views(), same, |i| a.value(i).as_bytes());
        }
        DataType::BinaryView => {
            let a = array.as_binary_view();
            mark_views(a.views(), same, |i| a.value(i));
        }
        DataType::Utf8 => {
            let a = array.as_string::<i32>();
            mark_values(n, same, |i| a.value(i).as_bytes());
        }
        DataType::LargeUtf8 => {
            let a = array.as_string::<i64>();
            mark_values(n, same, |i| a.value(i).as_bytes());
        }
        DataType::Binary => {
            let a = array.as_binary::<i32>();
            mark_values(n, same, |i| a.value(i));
        }
        DataType::LargeBinary => {
            let a = array.as_binary::<i64>();
            mark_values(n, same, |i| a.value(i));
        }
        DataType::Boolean => {
            let a = array.as_boolean();
            for i in 1..n {
                if a.value(i) != a.value(i - 1) {
                    same[i] = false;
                }
            }
        }
        t => {
            let Some(width) = t.primitive_width() else {
                return Err(DataFusionError::Internal(format!(
                    "run aggregation cannot group by {t}"
                )));
            };
            let data = array.to_data();
            let Some(buffer) = data.buffers().first() else {
                return Err(DataFusionError::Internal(format!(
                    "{t} array without a values buffer"
                )));
            };
            let start = data.offset() * width;
            let Some(bytes) = buffer.as_slice().get(start..start + n * width) else {
                return Err(DataFusionError::Internal(format!(
                    "{t} array shorter than its length"
                )));
            };
            match width {
                1 => mark_fixed::<1>(bytes, same),
                2 => mark_fixed::<2>(bytes, same),
                4 => mark_fixed::<4>(bytes, same),
                8 => mark_fixed::<8>(bytes, same),
                16 => mark_fixed::<16>(bytes, same),
                32 => mark_fixed::<32>(bytes, same),
                w => {
                    let values: Vec<&[u8]> = bytes.chunks_exact(w).collect();
                    mark_values(n, same, |i| values[i]);
                }
            }
        }
    }
    // A null and a value differ, whatever the value's slot holds.
    if let Some(nulls) = array.logical_nulls() {
        for i in 1..n {
            if nulls.is_valid(i) != nulls.is_valid(i - 1) {
                same[i] = false;
            }
        }
    }
    Ok(())
}

fn mark_fixed<const N: usize>(bytes: &[u8], same: &mut [bool]) {
    let mut previous: Option<&[u8]> = None;
    for (i, value) in bytes.chunks_exact(N).enumerate() {
        if let Some(p) = previous {
            let (a, b): (Option<&[u8; N]>, Option<&[u8; N]>) =
                (p.try_into().ok(), value.try_into().ok());
            if a != b {
                same[i] = false;
            }
        }
        previous = Some(value);
    }
}

fn mark_values<'a>(n: usize, same: &mut [bool], value: impl Fn(usize) -> &'a [u8]) {
    for i in 1..n {
        if same[i] && value(i) != value(i - 1) {
            same[i] = false;
        }
    }
}

/// Views: equal views are equal values (same inline bytes, or same length, prefix, buffer and
/// offset); views that differ are compared by length, then by value.
fn mark_views<'a>(views: &[u128], same: &mut [bool], value: impl Fn(usize) -> &'a [u8]) {
    for i in 1..views.len() {
        let (a, b) = (views[i - 1], views[i]);
        if a == b || !same[i] {
            continue;
        }
        // The low 32 bits are the length; an inline value (12 bytes or fewer) is all in the view.
        let len = b as u32;
        if a as u32 != len || len <= 12 || value(i) != value(i - 1) {
            same[i] = false;
        }
    }
}

#[cfg(test)]
mod tests;
