//! Functions that build values from their arguments, bounded by `--max-value-bytes`.
//!
//! `repeat('x', 2000000000)` asks for a 2 GB string in one call: no memory pool sees it (DataFusion
//! pools count what operators reserve, not what a function allocates) and no time limit can stop
//! a call that is under way. So every function whose output can be far larger than its inputs is
//! replaced, under its own name and aliases, by a wrapper that first works out from the argument
//! values how large each output value would be, and refuses the call before anything is allocated
//! when one value would pass `--max-value-bytes` or the values of one batch together would pass
//! [`BATCH_FACTOR`] times it. After the call, the output is measured too (for the functions whose
//! growth is not computed, and as a second line). Aggregates that concatenate (`string_agg`,
//! `array_agg`) are checked after every batch they take in.
//!
//! The refusal is a [`ValueTooLarge`] error naming the function: HTTP 400, Postgres `54000`.

use std::any::Any;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, FieldRef, IntervalUnit, TimeUnit};
use datafusion::common::{Result as DfResult, ScalarValue};
use datafusion::error::DataFusionError;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, ColumnarValue, Documentation, ReturnFieldArgs,
    ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
};
use datafusion::prelude::SessionContext;

/// The values one call produces for a batch may add up to this many times `--max-value-bytes`.
pub const BATCH_FACTOR: usize = 4;

/// Default of `--max-value-bytes`: 16 MiB.
pub const DEFAULT_MAX_VALUE_BYTES: usize = 16 << 20;

/// A function would build a value (or a batch of values) over the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueTooLarge {
    /// The function's name.
    pub function: String,
    /// How large the value (or batch) would be, in bytes.
    pub bytes: usize,
    /// The limit it passes, in bytes.
    pub limit: usize,
    /// What is too large.
    pub kind: TooLarge,
}

/// What a [`ValueTooLarge`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TooLarge {
    /// One value.
    Value,
    /// The values one call makes for a batch of rows.
    Batch,
    /// A regular expression (its text), which takes long to compile when large.
    Pattern,
}

/// The longest regular expression the `regexp_*` functions take: compiling a large one (say
/// `(a|b)` repeated 100,000 times) takes many seconds in one call that no time limit stops.
pub const MAX_PATTERN_BYTES: usize = 16 * 1024;

impl fmt::Display for ValueTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            TooLarge::Batch => write!(
                f,
                "{}: the values of one batch would take {} bytes, more than {BATCH_FACTOR} x --max-value-bytes ({} bytes): build smaller values",
                self.function, self.bytes, self.limit
            ),
            TooLarge::Value => write!(
                f,
                "{}: a value of {} bytes is larger than --max-value-bytes ({} bytes): build smaller values or raise the limit",
                self.function, self.bytes, self.limit
            ),
            TooLarge::Pattern => write!(
                f,
                "{}: a regular expression of {} bytes is longer than {} bytes: use a shorter pattern",
                self.function, self.bytes, self.limit
            ),
        }
    }
}

impl std::error::Error for ValueTooLarge {}

impl ValueTooLarge {
    /// The [`ValueTooLarge`] at the root of `e`, if that is what it is.
    pub fn find(e: &DataFusionError) -> Option<&ValueTooLarge> {
        match e.find_root() {
            DataFusionError::External(inner) => inner.downcast_ref::<ValueTooLarge>(),
            DataFusionError::ArrowError(inner, _) => match inner.as_ref() {
                arrow::error::ArrowError::ExternalError(inner) => {
                    inner.downcast_ref::<ValueTooLarge>()
                }
                _ => None,
            },
            _ => None,
        }
    }
}

fn too_large(function: &str, bytes: usize, limit: usize, kind: TooLarge) -> DataFusionError {
    DataFusionError::External(Box::new(ValueTooLarge {
        function: function.to_string(),
        bytes,
        limit,
        kind,
    }))
}

/// How a function's output grows with its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Growth {
    /// `repeat(s, n)`: `len(s) * n`.
    Repeat,
    /// `lpad(s, n [, fill])`, `rpad`: `n` characters of `fill` (at most 4 bytes each).
    Pad,
    /// `concat`, `array_concat`, `array_append`, `array_prepend`: the arguments together.
    Sum,
    /// `concat_ws(sep, ...)`: the arguments together, the separator between each two.
    Joined,
    /// `array_repeat(x, n)`: `n` copies of `x`.
    ArrayRepeat,
    /// `array_resize(a, n [, fill])`: `n` elements.
    ArrayResize,
    /// `range(start, stop, step)`, `generate_series`: `(stop - start) / step` elements.
    Range,
    /// `replace(s, from, to)`: every `from` becomes `to`.
    Replace,
    /// `regexp_replace(s, pattern, replacement [, flags])`: every match (at most one per byte
    /// of `s`, plus one) becomes the replacement, whose `$n` groups are at most `s` each.
    RegexpReplace,
    /// `translate(s, from, to)`: each character mapped to one of at most 4 bytes.
    Translate,
    /// Measured after the call only (`make_array`).
    Measured,
    /// `regexp_like(s, pattern …)` and the other `regexp_*`: the output is small, the pattern
    /// (second argument) is bounded by [`MAX_PATTERN_BYTES`].
    Pattern,
}

/// The functions that are bounded, and how they grow.
const SCALARS: &[(&str, Growth)] = &[
    ("repeat", Growth::Repeat),
    ("lpad", Growth::Pad),
    ("rpad", Growth::Pad),
    ("concat", Growth::Sum),
    ("concat_ws", Growth::Joined),
    ("array_concat", Growth::Sum),
    ("array_append", Growth::Sum),
    ("array_prepend", Growth::Sum),
    ("array_repeat", Growth::ArrayRepeat),
    ("array_resize", Growth::ArrayResize),
    ("range", Growth::Range),
    ("generate_series", Growth::Range),
    ("replace", Growth::Replace),
    ("regexp_replace", Growth::RegexpReplace),
    ("translate", Growth::Translate),
    ("make_array", Growth::Measured),
    ("regexp_like", Growth::Pattern),
    ("regexp_match", Growth::Pattern),
    ("regexp_count", Growth::Pattern),
    ("regexp_instr", Growth::Pattern),
    ("regexp_substr", Growth::Pattern),
];

/// Aggregates whose one value grows with every row they take in.
const AGGREGATES: &[&str] = &["string_agg", "array_agg"];

/// Replaces the functions of [`SCALARS`] and [`AGGREGATES`] registered in `ctx` by bounded
/// wrappers (under the same names and aliases).
pub fn register(ctx: &SessionContext, max_value_bytes: usize) {
    let state = ctx.state();
    for (name, growth) in SCALARS {
        let Ok(inner) = state.udf(name) else {
            tracing::debug!(function = name, "not registered; nothing to bound");
            continue;
        };
        if (inner.inner().as_ref() as &dyn Any).is::<BoundedScalar>() {
            continue;
        }
        let wrapped = BoundedScalar {
            inner: inner.as_ref().clone(),
            growth: *growth,
            max: max_value_bytes,
        };
        ctx.register_udf(ScalarUDF::new_from_impl(wrapped));
    }
    for name in AGGREGATES {
        let Ok(inner) = state.udaf(name) else {
            tracing::debug!(function = name, "not registered; nothing to bound");
            continue;
        };
        if (inner.inner().as_ref() as &dyn Any).is::<BoundedAggregate>() {
            continue;
        }
        let wrapped = BoundedAggregate {
            inner: inner.as_ref().clone(),
            max: max_value_bytes,
        };
        ctx.register_udaf(AggregateUDF::new_from_impl(wrapped));
    }
}

/// A scalar function whose output is bounded.
#[derive(Debug, PartialEq, Eq, Hash)]
struct BoundedScalar {
    inner: ScalarUDF,
    growth: Growth,
    max: usize,
}

impl ScalarUDFImpl for BoundedScalar {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> DfResult<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> DfResult<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let rows = args.number_rows;
        if matches!(self.growth, Growth::Pattern | Growth::RegexpReplace) {
            if let Some(pattern) = args.args.get(1) {
                let sizes = Sizes::of(pattern);
                let longest = (0..rows.max(1)).map(|i| sizes.at(i)).max().unwrap_or(0);
                if longest > MAX_PATTERN_BYTES {
                    return Err(too_large(
                        self.name(),
                        longest,
                        MAX_PATTERN_BYTES,
                        TooLarge::Pattern,
                    ));
                }
            }
        }
        if let Some((largest, total)) = estimate(self.growth, &args.args, rows) {
            self.check(largest, total)?;
        }
        let out = self.inner.invoke_with_args(args)?;
        let (largest, total) = measure(&out);
        self.check(largest, total)?;
        Ok(out)
    }
}

impl BoundedScalar {
    fn check(&self, largest: usize, total: usize) -> DfResult<()> {
        if largest > self.max {
            return Err(too_large(self.name(), largest, self.max, TooLarge::Value));
        }
        let batch = self.max.saturating_mul(BATCH_FACTOR);
        if total > batch {
            return Err(too_large(self.name(), total, batch, TooLarge::Batch));
        }
        Ok(())
    }
}

/// An aggregate whose one value is bounded.
#[derive(Debug, PartialEq, Eq, Hash)]
struct BoundedAggregate {
    inner: AggregateUDF,
    max: usize,
}

impl AggregateUDFImpl for BoundedAggregate {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field(&self, arg_fields: &[FieldRef]) -> DfResult<FieldRef> {
        self.inner.return_field(arg_fields)
    }

    fn is_nullable(&self) -> bool {
        self.inner.is_nullable()
    }

    fn accumulator(&self, acc_args: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        Ok(Box::new(BoundedAccumulator {
            inner: self.inner.accumulator(acc_args)?,
            function: self.inner.name().to_string(),
            max: self.max,
        }))
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        Ok(Box::new(BoundedAccumulator {
            inner: self.inner.create_sliding_accumulator(args)?,
            function: self.inner.name().to_string(),
            max: self.max,
        }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> DfResult<Vec<FieldRef>> {
        self.inner.state_fields(args)
    }

    // Grouped aggregation goes through DataFusion's adapter over `accumulator`, so that every
    // group's value is checked (the adapter also reports their memory to the query's pool).
    fn groups_accumulator_supported(&self, _args: AccumulatorArgs) -> bool {
        false
    }

    fn order_sensitivity(&self) -> datafusion::logical_expr::utils::AggregateOrderSensitivity {
        self.inner.inner().order_sensitivity()
    }

    fn with_beneficial_ordering(
        self: Arc<Self>,
        beneficial_ordering: bool,
    ) -> DfResult<Option<Arc<dyn AggregateUDFImpl>>> {
        let Some(inner) = self
            .inner
            .clone()
            .with_beneficial_ordering(beneficial_ordering)?
        else {
            return Ok(None);
        };
        Ok(Some(Arc::new(BoundedAggregate {
            inner,
            max: self.max,
        })))
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> DfResult<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn default_value(&self, data_type: &DataType) -> DfResult<ScalarValue> {
        self.inner.default_value(data_type)
    }

    fn supports_null_handling_clause(&self) -> bool {
        self.inner.inner().supports_null_handling_clause()
    }

    fn supports_within_group_clause(&self) -> bool {
        self.inner.inner().supports_within_group_clause()
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }
}

/// An accumulator whose value may not grow past `max` bytes.
#[derive(Debug)]
struct BoundedAccumulator {
    inner: Box<dyn Accumulator>,
    function: String,
    max: usize,
}

impl BoundedAccumulator {
    fn check(&self) -> DfResult<()> {
        let size = self.inner.size();
        if size > self.max {
            return Err(too_large(&self.function, size, self.max, TooLarge::Value));
        }
        Ok(())
    }
}

impl Accumulator for BoundedAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DfResult<()> {
        self.inner.update_batch(values)?;
        self.check()
    }

    fn evaluate(&mut self) -> DfResult<ScalarValue> {
        self.inner.evaluate()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn state(&mut self) -> DfResult<Vec<ScalarValue>> {
        self.inner.state()
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> DfResult<()> {
        self.inner.merge_batch(states)?;
        self.check()
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> DfResult<()> {
        self.inner.retract_batch(values)
    }

    fn supports_retract_batch(&self) -> bool {
        self.inner.supports_retract_batch()
    }
}

/// The largest value and the total, in bytes, that `growth` makes of `args` over `rows` rows;
/// `None` when it cannot tell (the output is measured after the call then).
fn estimate(growth: Growth, args: &[ColumnarValue], rows: usize) -> Option<(usize, usize)> {
    let rows = rows.max(1);
    match growth {
        Growth::Measured | Growth::Pattern => None,
        Growth::ArrayRepeat | Growth::ArrayResize | Growth::Range => {
            estimate_array(growth, args, rows)
        }
        Growth::Repeat
        | Growth::Pad
        | Growth::Sum
        | Growth::Joined
        | Growth::Replace
        | Growth::RegexpReplace
        | Growth::Translate => estimate_string(growth, args, rows),
    }
}

/// The largest and the total of `f(i)` over rows `0..rows`.
fn largest_and_total(rows: usize, f: &dyn Fn(usize) -> usize) -> (usize, usize) {
    let mut largest = 0usize;
    let mut total = 0usize;
    for i in 0..rows {
        let v = f(i);
        largest = largest.max(v);
        total = total.saturating_add(v);
    }
    (largest, total)
}

/// [`estimate`] of the functions that make strings.
fn estimate_string(growth: Growth, args: &[ColumnarValue], rows: usize) -> Option<(usize, usize)> {
    let each = |f: &dyn Fn(usize) -> usize| largest_and_total(rows, f);
    let size = |k: usize| args.get(k).map(Sizes::of);
    let count = |k: usize| args.get(k).map(Counts::of);
    match growth {
        Growth::Repeat => {
            let (s, n) = (size(0)?, count(1)?);
            Some(each(&|i| {
                s.at(i).saturating_mul(n.at(i).unwrap_or(0).max(0) as usize)
            }))
        }
        Growth::Pad => {
            let (s, n) = (size(0)?, count(1)?);
            // A fill of several characters still adds `n` characters; 4 bytes is the widest.
            let width = if args.len() > 2 { 4 } else { 1 };
            Some(each(&|i| {
                let n = n.at(i).unwrap_or(0).max(0) as usize;
                s.at(i).max(n.saturating_mul(width))
            }))
        }
        Growth::Sum | Growth::Joined => {
            let sizes: Vec<Sizes> = args.iter().map(Sizes::of).collect();
            let seps = if growth == Growth::Joined {
                args.len()
            } else {
                0
            };
            Some(each(&|i| {
                let sum = sizes
                    .iter()
                    .fold(0usize, |acc, s| acc.saturating_add(s.at(i)));
                sum.saturating_add(sizes.first().map_or(0, |s| s.at(i)).saturating_mul(seps))
            }))
        }
        Growth::Replace => {
            let (s, from, to) = (size(0)?, size(1)?, size(2)?);
            Some(each(&|i| {
                let len = s.at(i);
                let matches = len / from.at(i).max(1) + 1;
                len.saturating_add(matches.saturating_mul(to.at(i)))
            }))
        }
        Growth::RegexpReplace => {
            let (s, repl) = (size(0)?, args.get(2)?);
            let groups = Groups::of(repl);
            let repl = Sizes::of(repl);
            Some(each(&|i| {
                let len = s.at(i);
                let per_match = repl.at(i).saturating_add(groups.at(i).saturating_mul(len));
                len.saturating_add((len + 1).saturating_mul(per_match))
            }))
        }
        Growth::Translate => {
            let s = size(0)?;
            Some(each(&|i| s.at(i).saturating_mul(4)))
        }
        Growth::Measured
        | Growth::Pattern
        | Growth::ArrayRepeat
        | Growth::ArrayResize
        | Growth::Range => None,
    }
}

/// [`estimate`] of the functions that make arrays.
fn estimate_array(growth: Growth, args: &[ColumnarValue], rows: usize) -> Option<(usize, usize)> {
    let each = |f: &dyn Fn(usize) -> usize| largest_and_total(rows, f);
    let size = |k: usize| args.get(k).map(Sizes::of);
    let count = |k: usize| args.get(k).map(Counts::of);
    match growth {
        Growth::ArrayRepeat => {
            let (x, n) = (size(0)?, count(1)?);
            Some(each(&|i| {
                x.at(i)
                    .max(1)
                    .saturating_mul(n.at(i).unwrap_or(0).max(0) as usize)
            }))
        }
        Growth::ArrayResize => {
            let (a, n) = (size(0)?, count(1)?);
            let fill = size(2);
            Some(each(&|i| {
                let n = n.at(i).unwrap_or(0).max(0) as usize;
                let elem = fill.as_ref().map_or(8, |f| f.at(i).max(8));
                a.at(i).saturating_add(n.saturating_mul(elem))
            }))
        }
        Growth::Range => {
            let r = RangeArgs::of(args)?;
            Some(each(&|i| r.elements(i).saturating_mul(8)))
        }
        _ => None,
    }
}

/// The byte size of each row's value of an argument.
enum Sizes {
    Same(usize),
    Each(Vec<usize>),
}

impl Sizes {
    fn of(v: &ColumnarValue) -> Self {
        match v {
            ColumnarValue::Scalar(s) => Sizes::Same(scalar_bytes(s)),
            ColumnarValue::Array(a) => match string_lengths(a.as_ref()) {
                Some(lengths) => Sizes::Each(lengths),
                None => Sizes::Same(a.get_array_memory_size() / a.len().max(1)),
            },
        }
    }

    fn at(&self, i: usize) -> usize {
        match self {
            Sizes::Same(n) => *n,
            Sizes::Each(v) => v.get(i).copied().unwrap_or(0),
        }
    }
}

/// The byte size of a scalar value (strings: their length).
fn scalar_bytes(s: &ScalarValue) -> usize {
    match s {
        ScalarValue::Utf8(v) | ScalarValue::LargeUtf8(v) | ScalarValue::Utf8View(v) => {
            v.as_ref().map_or(0, String::len)
        }
        ScalarValue::Binary(v) | ScalarValue::LargeBinary(v) | ScalarValue::BinaryView(v) => {
            v.as_ref().map_or(0, Vec::len)
        }
        other => other
            .size()
            .saturating_sub(std::mem::size_of::<ScalarValue>())
            .max(1),
    }
}

/// The byte length of each value of a string or binary array.
fn string_lengths(a: &dyn Array) -> Option<Vec<usize>> {
    let lengths = match a.data_type() {
        DataType::Utf8 => a
            .as_string::<i32>()
            .iter()
            .map(|v| v.map_or(0, str::len))
            .collect(),
        DataType::LargeUtf8 => a
            .as_string::<i64>()
            .iter()
            .map(|v| v.map_or(0, str::len))
            .collect(),
        DataType::Utf8View => a
            .as_string_view()
            .iter()
            .map(|v| v.map_or(0, str::len))
            .collect(),
        DataType::Binary => a
            .as_binary::<i32>()
            .iter()
            .map(|v| v.map_or(0, <[u8]>::len))
            .collect(),
        DataType::LargeBinary => a
            .as_binary::<i64>()
            .iter()
            .map(|v| v.map_or(0, <[u8]>::len))
            .collect(),
        DataType::BinaryView => a
            .as_binary_view()
            .iter()
            .map(|v| v.map_or(0, <[u8]>::len))
            .collect(),
        _ => return None,
    };
    Some(lengths)
}

/// The integer value of each row of an argument (a count), if it is one.
enum Counts {
    Same(Option<i64>),
    Each(Vec<Option<i64>>),
}

impl Counts {
    fn of(v: &ColumnarValue) -> Self {
        match v {
            ColumnarValue::Scalar(s) => {
                Counts::Same(s.cast_to(&DataType::Int64).ok().and_then(|v| match v {
                    ScalarValue::Int64(n) => n,
                    _ => None,
                }))
            }
            ColumnarValue::Array(a) => match arrow::compute::cast(a, &DataType::Int64) {
                Ok(c) => Counts::Each(
                    c.as_primitive::<arrow::datatypes::Int64Type>()
                        .iter()
                        .collect(),
                ),
                Err(_) => Counts::Same(None),
            },
        }
    }

    fn at(&self, i: usize) -> Option<i64> {
        match self {
            Counts::Same(n) => *n,
            Counts::Each(v) => v.get(i).copied().flatten(),
        }
    }
}

/// How many capture-group references (`$1`, `${name}`, `\1`) a replacement holds, per row.
struct Groups(Counts);

impl Groups {
    fn of(v: &ColumnarValue) -> Self {
        let count = |s: &str| s.matches('$').count() as i64 + s.matches('\\').count() as i64;
        Groups(match v {
            ColumnarValue::Scalar(s) => Counts::Same(match s {
                ScalarValue::Utf8(Some(t))
                | ScalarValue::LargeUtf8(Some(t))
                | ScalarValue::Utf8View(Some(t)) => Some(count(t)),
                _ => Some(0),
            }),
            ColumnarValue::Array(a) => {
                let texts: Option<Vec<Option<i64>>> = match a.data_type() {
                    DataType::Utf8 => {
                        Some(a.as_string::<i32>().iter().map(|v| v.map(count)).collect())
                    }
                    DataType::LargeUtf8 => {
                        Some(a.as_string::<i64>().iter().map(|v| v.map(count)).collect())
                    }
                    DataType::Utf8View => {
                        Some(a.as_string_view().iter().map(|v| v.map(count)).collect())
                    }
                    _ => None,
                };
                match texts {
                    Some(t) => Counts::Each(t),
                    None => Counts::Same(Some(0)),
                }
            }
        })
    }

    fn at(&self, i: usize) -> usize {
        self.0.at(i).unwrap_or(0).max(0) as usize
    }
}

/// The arguments of `range`/`generate_series` as integers on one scale (nanoseconds for times).
struct RangeArgs {
    start: Counts,
    stop: Counts,
    step: Counts,
}

impl RangeArgs {
    fn of(args: &[ColumnarValue]) -> Option<Self> {
        let (start, stop, step) = match args {
            [stop] => (None, stop, None),
            [start, stop] => (Some(start), stop, None),
            [start, stop, step] => (Some(start), stop, Some(step)),
            _ => return None,
        };
        let on_scale = |v: &ColumnarValue| -> Option<Counts> {
            match v.data_type() {
                DataType::Int8
                | DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::UInt8
                | DataType::UInt16
                | DataType::UInt32
                | DataType::UInt64 => Some(Counts::of(v)),
                DataType::Date32 => Some(scaled(v, &DataType::Int32, 86_400_000_000_000)),
                DataType::Date64 => Some(scaled(v, &DataType::Int64, 1_000_000)),
                DataType::Timestamp(_, tz) => {
                    let ns = v
                        .cast_to(&DataType::Timestamp(TimeUnit::Nanosecond, tz.clone()), None)
                        .ok()?;
                    Some(scaled(&ns, &DataType::Int64, 1))
                }
                DataType::Interval(_) => {
                    let mdn = v
                        .cast_to(&DataType::Interval(IntervalUnit::MonthDayNano), None)
                        .ok()?;
                    Some(interval_nanos(&mdn))
                }
                _ => None,
            }
        };
        Some(Self {
            start: match start {
                Some(s) => on_scale(s)?,
                None => Counts::Same(Some(0)),
            },
            stop: on_scale(stop)?,
            step: match step {
                Some(s) => on_scale(s)?,
                None => match stop.data_type() {
                    DataType::Date32 | DataType::Date64 => Counts::Same(Some(86_400_000_000_000)),
                    _ => Counts::Same(Some(1)),
                },
            },
        })
    }

    fn elements(&self, i: usize) -> usize {
        let (Some(start), Some(stop), Some(step)) =
            (self.start.at(i), self.stop.at(i), self.step.at(i))
        else {
            return 0;
        };
        if step == 0 {
            return 0;
        }
        let span = (stop as i128 - start as i128).unsigned_abs();
        let n = span / (step as i128).unsigned_abs() + 1;
        usize::try_from(n).unwrap_or(usize::MAX)
    }
}

/// An integer-like argument (a date, a timestamp) as integers times `factor`.
fn scaled(v: &ColumnarValue, as_int: &DataType, factor: i64) -> Counts {
    let Ok(ints) = v.cast_to(as_int, None) else {
        return Counts::Same(None);
    };
    match Counts::of(&ints) {
        Counts::Same(n) => Counts::Same(n.map(|n| n.saturating_mul(factor))),
        Counts::Each(v) => Counts::Each(
            v.into_iter()
                .map(|n| n.map(|n| n.saturating_mul(factor)))
                .collect(),
        ),
    }
}

/// An interval as nanoseconds, a month counted as 30 days (the shortest a step can be is
/// what matters: more elements, never fewer).
fn interval_nanos(v: &ColumnarValue) -> Counts {
    const DAY: i64 = 86_400_000_000_000;
    let of = |months: i32, days: i32, nanos: i64| -> i64 {
        (months as i64)
            .saturating_mul(28 * DAY)
            .saturating_add((days as i64).saturating_mul(DAY))
            .saturating_add(nanos)
    };
    match v {
        ColumnarValue::Scalar(ScalarValue::IntervalMonthDayNano(Some(i))) => {
            Counts::Same(Some(of(i.months, i.days, i.nanoseconds)))
        }
        ColumnarValue::Scalar(_) => Counts::Same(None),
        ColumnarValue::Array(a) => match a.data_type() {
            DataType::Interval(IntervalUnit::MonthDayNano) => Counts::Each(
                a.as_primitive::<arrow::datatypes::IntervalMonthDayNanoType>()
                    .iter()
                    .map(|v| v.map(|i| of(i.months, i.days, i.nanoseconds)))
                    .collect(),
            ),
            _ => Counts::Same(None),
        },
    }
}

/// The largest value and the total size of a function's output, in bytes.
fn measure(out: &ColumnarValue) -> (usize, usize) {
    match out {
        ColumnarValue::Scalar(s) => {
            let n = scalar_bytes(s);
            (n, n)
        }
        ColumnarValue::Array(a) => {
            let total = a.get_array_memory_size();
            let largest = match string_lengths(a.as_ref()) {
                Some(lengths) => lengths.into_iter().max().unwrap_or(0),
                None => list_largest(a.as_ref()).unwrap_or(0),
            };
            (largest, total)
        }
    }
}

/// The largest value of a list array, in bytes (its element count times the average element
/// size).
fn list_largest(a: &dyn Array) -> Option<usize> {
    let (lengths, values): (Vec<usize>, &ArrayRef) = match a.data_type() {
        DataType::List(_) => {
            let l = a.as_list::<i32>();
            (
                l.offsets()
                    .windows(2)
                    .map(|w| (w[1] - w[0]).max(0) as usize)
                    .collect(),
                l.values(),
            )
        }
        DataType::LargeList(_) => {
            let l = a.as_list::<i64>();
            (
                l.offsets()
                    .windows(2)
                    .map(|w| (w[1] - w[0]).max(0) as usize)
                    .collect(),
                l.values(),
            )
        }
        _ => return None,
    };
    let per_element = values.get_array_memory_size() / values.len().max(1);
    lengths
        .into_iter()
        .max()
        .map(|n| n.saturating_mul(per_element.max(1)))
}

#[cfg(test)]
mod tests;
