//! `alerts_active`: the alerts that are pending or firing now, one row each, with the columns
//! of `alerts` (`time` is when the alert entered its state: started firing, or became
//! pending). On a server that runs the rules it is read from the rule engine's state, which the
//! engine keeps current at every evaluation (and saves, so it survives a restart): answering
//! "what fires now" costs the number of alerts, not the length of the history. A query node
//! runs no rules; there the same table is a view over `alerts`, each alert's latest transition
//! when it is pending or firing (which reads the whole history).

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{MemTable, Session, TableProvider};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;

use crate::engine::{Alert, State};
use crate::error::{Error, Result};
use crate::history::{self, HistoryRow};
use crate::service::Alerting;

/// The table's name.
pub const NAME: &str = "alerts_active";

/// The view a server without rules answers `alerts_active` with.
const FROM_HISTORY: &str = "SELECT a.time, a.rule, a.state, a.labels, a.value, a.fingerprint \
    FROM alerts a JOIN (SELECT fingerprint, max(time) AS last FROM alerts GROUP BY fingerprint) l \
    ON a.fingerprint = l.fingerprint AND a.time = l.last WHERE a.state IN ('pending', 'firing')";

/// An active alert's row: `time` is when it started firing, or became pending.
fn row(alert: &Alert) -> Option<HistoryRow> {
    let since = match alert.state {
        State::Firing => alert.fired_at.unwrap_or(alert.active_at),
        State::Pending => alert.active_at,
        State::Resolved => return None,
    };
    Some(HistoryRow::of(alert, since))
}

/// `alerts_active` from the rule engine's state.
#[derive(Debug)]
struct ActiveTable(Arc<Alerting>);

#[async_trait]
impl TableProvider for ActiveTable {
    fn schema(&self) -> SchemaRef {
        history::schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let rows: Vec<HistoryRow> = self.0.engine().alerts().iter().filter_map(row).collect();
        let batch = history::to_batch(&rows).map_err(|e| DataFusionError::External(Box::new(e)))?;
        let mem = MemTable::try_new(history::schema(), vec![vec![batch]])?;
        mem.scan(state, projection, filters, limit).await
    }
}

/// Registers `alerts_active` in `ctx`: from `alerting`'s rule engine when the server runs the
/// rules, else as the view over `alerts`.
pub async fn register(ctx: &SessionContext, alerting: Option<Arc<Alerting>>) -> Result<()> {
    register_as(ctx, NAME, alerting).await
}

/// [`register`] under another name (tests compare the two kinds).
pub(crate) async fn register_as(
    ctx: &SessionContext,
    name: &str,
    alerting: Option<Arc<Alerting>>,
) -> Result<()> {
    let table: Arc<dyn TableProvider> = match alerting {
        Some(a) => Arc::new(ActiveTable(a)),
        None => ctx
            .sql(FROM_HISTORY)
            .await
            .map_err(|e| Error::Other(format!("cannot plan the {name} view: {e}")))?
            .into_view(),
    };
    ctx.register_table(name, table)
        .map_err(|e| Error::Other(format!("cannot register the {name} table: {e}")))?;
    Ok(())
}
