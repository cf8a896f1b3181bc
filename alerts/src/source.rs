//! Running a rule's SQL: through the server's query engine, with `now()` set to the injected
//! clock's time, so rules are evaluated deterministically in tests.

use std::collections::BTreeMap;

use arrow::array::{Array, Float64Array};
use arrow::datatypes::DataType;
use arrow::util::display::array_value_to_string;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SQLOptions;
use gpuwatch_query::QueryEngine;

use crate::error::{Error, Result};

/// One row of a rule's answer: an alert instance.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    /// Every non-`value` column, as text (null columns left out).
    pub labels: BTreeMap<String, String>,
    /// The `value` column (NaN if the query has none or it is null).
    pub value: f64,
}

/// Where rule queries run.
#[async_trait]
pub trait RuleSource: Send + Sync {
    /// Runs `sql` as of `now_nanos` and returns its rows as instances.
    async fn instances(&self, rule: &str, sql: &str, now_nanos: i64) -> Result<Vec<Instance>>;
}

/// Rules run through a [`QueryEngine`], read-only, under its time limit.
#[derive(Debug, Clone)]
pub struct EngineSource {
    engine: QueryEngine,
    timeout: std::time::Duration,
}

impl EngineSource {
    /// A source over `engine`; a query longer than `timeout` fails.
    pub fn new(engine: QueryEngine, timeout: std::time::Duration) -> Self {
        Self { engine, timeout }
    }
}

#[async_trait]
impl RuleSource for EngineSource {
    async fn instances(&self, rule: &str, sql: &str, now_nanos: i64) -> Result<Vec<Instance>> {
        let fail = |message: String| Error::Query {
            rule: rule.to_string(),
            message,
        };
        gpuwatch_query::gate::check(sql).map_err(|e| fail(e.to_string()))?;
        let run = async {
            let mut state = self.engine.context().state();
            state.execution_props_mut().query_execution_start_time =
                Some(DateTime::<Utc>::from_timestamp_nanos(now_nanos));
            let plan = state
                .create_logical_plan(sql)
                .await
                .map_err(|e| fail(e.to_string()))?;
            SQLOptions::new()
                .with_allow_ddl(false)
                .with_allow_dml(false)
                .with_allow_statements(false)
                .verify_plan(&plan)
                .map_err(|e| fail(e.to_string()))?;
            DataFrame::new(state, plan)
                .collect()
                .await
                .map_err(|e| fail(e.to_string()))
        };
        let batches = tokio::time::timeout(self.timeout, run)
            .await
            .map_err(|_| fail(format!("ran longer than {:?}", self.timeout)))??;
        let mut out = Vec::new();
        for b in &batches {
            let schema = b.schema();
            let value_idx = schema.index_of("value").ok();
            let values = match value_idx {
                Some(i) => Some(
                    arrow::compute::cast(b.column(i), &DataType::Float64)
                        .map_err(|e| fail(format!("column value is not numeric: {e}")))?,
                ),
                None => None,
            };
            let values = values
                .as_ref()
                .and_then(|a| a.as_any().downcast_ref::<Float64Array>().cloned());
            for row in 0..b.num_rows() {
                let mut labels = BTreeMap::new();
                for (i, f) in schema.fields().iter().enumerate() {
                    if Some(i) == value_idx || b.column(i).is_null(row) {
                        continue;
                    }
                    let text =
                        array_value_to_string(b.column(i), row).map_err(|e| fail(e.to_string()))?;
                    labels.insert(f.name().clone(), text);
                }
                let value = match &values {
                    Some(v) if !v.is_null(row) => v.value(row),
                    _ => f64::NAN,
                };
                out.push(Instance { labels, value });
            }
        }
        Ok(out)
    }
}
