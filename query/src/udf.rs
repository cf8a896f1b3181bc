//! Time-series functions registered in every session: `increase(value, time)` and
//! `rate(value, time)`, aggregates over the counter samples of a group (docs/sql.md).
//!
//! Both read a cumulative counter (`energy_joules`, `xid_errors_total`, `ecc_*_total`) that may
//! restart from 0 (driver reload, agent restart). The samples of the group are put in time
//! order, whatever order they arrive in; each step adds the difference to the previous sample,
//! or, when the counter went down, the new value (the counter restarted from 0 and counted that
//! much since), as Prometheus does. Rows whose value or time is NULL are skipped.
//!
//! There is no extrapolation: the answer covers the span from the group's first sample to its
//! last, not the edges of a `date_bin` bucket or of the `WHERE` range (Prometheus's
//! `increase()` stretches its answer to the whole range; this does not). A group with fewer
//! than two samples gives NULL; `rate` also gives NULL when all samples share one time.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, ListArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, FieldRef, Float64Type, Int64Type, TimeUnit};
use datafusion::common::{ScalarValue, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Signature, Volatility,
};

/// What the aggregate answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    /// The counter's increase over the group's samples.
    Increase,
    /// The increase divided by the seconds between the first and the last sample.
    Rate,
}

/// `increase(value, time)` or `rate(value, time)`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct CounterAggregate {
    kind: Kind,
    signature: Signature,
}

impl CounterAggregate {
    fn new(kind: Kind) -> Self {
        Self {
            kind,
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

/// The `increase(value, time)` aggregate.
pub fn increase() -> AggregateUDF {
    AggregateUDF::from(CounterAggregate::new(Kind::Increase))
}

/// The `rate(value, time)` aggregate (per second).
pub fn rate() -> AggregateUDF {
    AggregateUDF::from(CounterAggregate::new(Kind::Rate))
}

impl AggregateUDFImpl for CounterAggregate {
    fn name(&self) -> &str {
        match self.kind {
            Kind::Increase => "increase",
            Kind::Rate => "rate",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let [value, time] = arg_types else {
            return plan_err!(
                "{}(value, time) takes 2 arguments, got {}",
                self.name(),
                arg_types.len()
            );
        };
        if !(value.is_numeric() || value.is_null()) {
            return plan_err!(
                "{}(value, time): value must be a number, got {value}",
                self.name()
            );
        }
        let time = match time {
            DataType::Timestamp(_, tz) => DataType::Timestamp(TimeUnit::Nanosecond, tz.clone()),
            DataType::Null => DataType::Timestamp(TimeUnit::Nanosecond, None),
            other => {
                return plan_err!(
                    "{}(value, time): time must be a timestamp (the column time), got {other}",
                    self.name()
                );
            }
        };
        Ok(vec![DataType::Float64, time])
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn accumulator(&self, _acc_args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(CounterAccumulator {
            kind: self.kind,
            points: Vec::new(),
        }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![
            Arc::new(Field::new_list(
                format_state_name(args.name, "times"),
                Field::new_list_field(DataType::Int64, true),
                true,
            )),
            Arc::new(Field::new_list(
                format_state_name(args.name, "values"),
                Field::new_list_field(DataType::Float64, true),
                true,
            )),
        ])
    }
}

/// The samples of one group: (ns since the epoch, value).
#[derive(Debug)]
struct CounterAccumulator {
    kind: Kind,
    points: Vec<(i64, f64)>,
}

impl CounterAccumulator {
    fn push_arrays(&mut self, values: &dyn Array, times: &dyn Array) -> Result<()> {
        let values = cast(values, &DataType::Float64)?;
        let times = cast(times, &DataType::Int64)?;
        let values = values.as_primitive::<Float64Type>();
        let times = times.as_primitive::<Int64Type>();
        for i in 0..values.len() {
            if values.is_null(i) || times.is_null(i) {
                continue;
            }
            let v = values.value(i);
            if v.is_finite() {
                self.points.push((times.value(i), v));
            }
        }
        Ok(())
    }
}

/// The increase of a counter over `points`, sorted by time; `None` below two points.
pub fn counter_increase(points: &[(i64, f64)]) -> Option<f64> {
    if points.len() < 2 {
        return None;
    }
    let mut total = 0.0;
    for w in points.windows(2) {
        let (previous, current) = (w[0].1, w[1].1);
        total += if current >= previous {
            current - previous
        } else {
            // A reset: the counter restarted from 0 and has counted `current` since.
            current
        };
    }
    Some(total)
}

impl Accumulator for CounterAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let [value, time] = values else {
            return plan_err!("counter aggregate expects 2 arguments");
        };
        self.push_arrays(value.as_ref(), time.as_ref())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        // Time order; equal times by value so that the answer does not depend on input order.
        self.points
            .sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        let Some(increase) = counter_increase(&self.points) else {
            return Ok(ScalarValue::Float64(None));
        };
        let answer = match self.kind {
            Kind::Increase => Some(increase),
            Kind::Rate => {
                let first = self.points.first().map_or(0, |p| p.0);
                let last = self.points.last().map_or(0, |p| p.0);
                let seconds = (i128::from(last) - i128::from(first)) as f64 / 1e9;
                (seconds > 0.0).then(|| increase / seconds)
            }
        };
        Ok(ScalarValue::Float64(answer))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.points.capacity() * std::mem::size_of::<(i64, f64)>()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let times = Int64Array::from_iter_values(self.points.iter().map(|p| p.0));
        let values = Float64Array::from_iter_values(self.points.iter().map(|p| p.1));
        let list = |a: ArrayRef| -> ScalarValue {
            ScalarValue::List(Arc::new(ListArray::new(
                Arc::new(Field::new_list_field(a.data_type().clone(), true)),
                arrow::buffer::OffsetBuffer::from_lengths([a.len()]),
                a,
                None,
            )))
        };
        Ok(vec![list(Arc::new(times)), list(Arc::new(values))])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let [times, values] = states else {
            return plan_err!("counter aggregate state has 2 columns");
        };
        let times = times.as_list::<i32>();
        let values = values.as_list::<i32>();
        for row in 0..times.len() {
            if times.is_null(row) || values.is_null(row) {
                continue;
            }
            self.push_arrays(values.value(row).as_ref(), times.value(row).as_ref())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
