//! Running a rule's query: SQL through the server's query engine with `now()` set to the
//! injected clock's time, PromQL as an instant query at that time (so rules are evaluated
//! deterministically in tests).

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
use crate::rules::Query;

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
    /// Runs `query` as of `now_nanos` and returns its rows (or series) as instances.
    async fn instances(&self, rule: &str, query: &Query, now_nanos: i64) -> Result<Vec<Instance>>;
}

/// Rules run through a [`QueryEngine`], read-only, under its time limit.
#[derive(Debug, Clone)]
pub struct EngineSource {
    engine: QueryEngine,
    timeout: std::time::Duration,
    promql: gpuwatch_promql::Settings,
}

impl EngineSource {
    /// A source over `engine`; a query longer than `timeout` fails. PromQL rules are evaluated
    /// with the default settings (lookback, sample limit) unless [`Self::with_promql`] says.
    pub fn new(engine: QueryEngine, timeout: std::time::Duration) -> Self {
        Self {
            engine,
            timeout,
            promql: gpuwatch_promql::Settings::default(),
        }
    }

    /// The same source, evaluating PromQL rules with `settings` (their timeout is the source's).
    pub fn with_promql(self, settings: gpuwatch_promql::Settings) -> Self {
        Self {
            promql: settings,
            ..self
        }
    }
}

#[async_trait]
impl RuleSource for EngineSource {
    async fn instances(&self, rule: &str, query: &Query, now_nanos: i64) -> Result<Vec<Instance>> {
        match query {
            Query::Sql(sql) => self.sql_instances(rule, &sql.0, now_nanos).await,
            Query::PromQL(expr) => self.promql_instances(rule, expr, now_nanos).await,
        }
    }
}

impl EngineSource {
    /// A PromQL rule: each series of the instant query at `now_nanos` is an instance, its
    /// labels those of the series without `__name__` (as Prometheus does), its value the
    /// sample's; a scalar is one instance without labels.
    async fn promql_instances(
        &self,
        rule: &str,
        expr: &str,
        now_nanos: i64,
    ) -> Result<Vec<Instance>> {
        let fail = |message: String| Error::Query {
            rule: rule.to_string(),
            message,
        };
        let parsed = gpuwatch_promql::parse_query(expr).map_err(|e| fail(e.to_string()))?;
        let t = now_nanos.div_euclid(1_000_000);
        let settings = gpuwatch_promql::Settings {
            timeout: self.timeout,
            ..self.promql.clone()
        };
        let ev = gpuwatch_promql::Evaluator::new(&self.engine, settings, t, t);
        let value = tokio::time::timeout(self.timeout, ev.eval_instant_top(&parsed, t))
            .await
            .map_err(|_| fail(format!("ran longer than {:?}", self.timeout)))?
            .map_err(|e| fail(e.to_string()))?;
        Ok(match value {
            gpuwatch_promql::Value::Vector(series) => series
                .into_iter()
                .filter_map(|s| {
                    let v = s.vals.first().copied().flatten()?;
                    let labels = s
                        .labels
                        .without_name()
                        .pairs()
                        .iter()
                        .cloned()
                        .collect::<BTreeMap<_, _>>();
                    Some(Instance { labels, value: v })
                })
                .collect(),
            gpuwatch_promql::Value::Scalar(v) => vec![Instance {
                labels: BTreeMap::new(),
                value: v.first().copied().unwrap_or(f64::NAN),
            }],
            other => {
                return Err(fail(format!(
                    "the expression gives a {}: an alerting expression gives an instant vector",
                    other.type_name()
                )));
            }
        })
    }

    async fn sql_instances(&self, rule: &str, sql: &str, now_nanos: i64) -> Result<Vec<Instance>> {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gpuwatch_query::EngineConfig;
    use gpuwatch_store::clock::ManualClock;
    use gpuwatch_store::ingest::remote_write::proto::{Label, Sample, TimeSeries, WriteRequest};
    use gpuwatch_store::{ReadStore, Store, StoreConfig};

    use super::*;
    use crate::rules::Sql;

    const T0_MS: i64 = 1_800_000_000_000;

    fn series(gpu: &str, temp: f64) -> TimeSeries {
        let labels = [
            ("__name__", "DCGM_FI_DEV_GPU_TEMP"),
            ("Hostname", "node-1"),
            ("UUID", &format!("GPU-{gpu}")),
            ("gpu", gpu),
            ("instance", "node-1:9400"),
            ("job", "dcgm"),
        ];
        TimeSeries {
            labels: labels
                .iter()
                .map(|(n, v)| Label {
                    name: n.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            samples: vec![Sample {
                value: temp,
                timestamp: T0_MS,
            }],
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn promql_rules_give_one_instance_per_series() {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = Arc::new(ManualClock::new(T0_MS * 1_000_000));
        let store = Arc::new(
            Store::open(
                StoreConfig {
                    wal_sync: false,
                    ..StoreConfig::new(dir.path().join("data"))
                },
                clock,
            )
            .expect("store"),
        );
        let req = WriteRequest {
            timeseries: vec![series("0", 91.0), series("1", 40.0)],
        };
        let (batch, _) =
            gpuwatch_store::ingest::remote_write::to_write_batch(&req, T0_MS * 1_000_000)
                .expect("decode");
        store.write(&batch).expect("write");
        let read: Arc<dyn ReadStore> = store;
        let engine = QueryEngine::new(read, EngineConfig::default()).expect("engine");
        let source = EngineSource::new(engine, std::time::Duration::from_secs(30));
        let now = (T0_MS + 10_000) * 1_000_000;
        let hot = source
            .instances(
                "GPUHot",
                &Query::PromQL("DCGM_FI_DEV_GPU_TEMP > 85".into()),
                now,
            )
            .await
            .expect("promql rule");
        assert_eq!(hot.len(), 1, "{hot:?}");
        assert_eq!(hot[0].value, 91.0);
        assert_eq!(hot[0].labels.get("UUID").map(String::as_str), Some("GPU-0"));
        assert_eq!(
            hot[0].labels.get("instance").map(String::as_str),
            Some("node-1:9400")
        );
        assert!(!hot[0].labels.contains_key("__name__"), "{hot:?}");
        // A scalar is one instance without labels; past the lookback nothing is returned.
        let n = source
            .instances(
                "Count",
                &Query::PromQL("scalar(count(DCGM_FI_DEV_GPU_TEMP))".into()),
                now,
            )
            .await
            .expect("scalar");
        assert_eq!(n[0].value, 2.0);
        let later = source
            .instances(
                "GPUHot",
                &Query::PromQL("DCGM_FI_DEV_GPU_TEMP > 85".into()),
                now + 600 * 1_000_000_000,
            )
            .await
            .expect("later");
        assert!(later.is_empty(), "{later:?}");
        // The same rule in SQL still works beside it.
        let sql = source
            .instances(
                "GPUHotSql",
                &Query::Sql(Sql(
                    "SELECT gpu_uuid, temperature_celsius AS value FROM gpu_metrics WHERE temperature_celsius > 85".into(),
                )),
                now,
            )
            .await
            .expect("sql rule");
        assert_eq!(sql.len(), 1);
    }
}
