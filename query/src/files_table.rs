//! `table_files`: one row per data file of every table in this server's view — which files back
//! the tables, how many rows and bytes each holds, its time range and compaction level. For
//! operators (is compaction keeping up? how large is a day?) and the benchmarks.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, Int64Builder, RecordBatch, StringBuilder, TimestampNanosecondBuilder, UInt8Builder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use datafusion::catalog::{MemTable, Session, TableProvider};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;
use gpuwatch_store::ReadStore;
use gpuwatch_store::schema::Table;

/// The table's name in SQL.
pub const NAME: &str = "table_files";

fn schema() -> SchemaRef {
    let ts = DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()));
    Arc::new(Schema::new(vec![
        Field::new("table_name", DataType::Utf8, false),
        Field::new("path", DataType::Utf8, false),
        Field::new("location", DataType::Utf8, false),
        Field::new("rows", DataType::Int64, false),
        Field::new("bytes", DataType::Int64, false),
        Field::new("min_time", ts.clone(), true),
        Field::new("max_time", ts, true),
        Field::new("level", DataType::UInt8, false),
    ]))
}

/// The provider, over the store's view.
#[derive(Debug)]
pub struct FilesTable(pub Arc<dyn ReadStore>);

impl FilesTable {
    fn batch(&self) -> DfResult<RecordBatch> {
        let mut table = StringBuilder::new();
        let mut path = StringBuilder::new();
        let mut location = StringBuilder::new();
        let mut rows = Int64Builder::new();
        let mut bytes = Int64Builder::new();
        let mut min = TimestampNanosecondBuilder::new().with_timezone("UTC");
        let mut max = TimestampNanosecondBuilder::new().with_timezone("UTC");
        let mut level = UInt8Builder::new();
        for t in Table::ALL {
            for (loc, f) in self.0.snapshot(t).files {
                table.append_value(t.name());
                path.append_value(&f.path);
                location.append_value(&loc);
                rows.append_value(i64::try_from(f.rows).unwrap_or(i64::MAX));
                bytes.append_value(i64::try_from(f.bytes).unwrap_or(i64::MAX));
                min.append_option(f.has_time_range().then_some(f.min_time));
                max.append_option(f.has_time_range().then_some(f.max_time));
                level.append_value(f.level);
            }
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(table.finish()),
            Arc::new(path.finish()),
            Arc::new(location.finish()),
            Arc::new(rows.finish()),
            Arc::new(bytes.finish()),
            Arc::new(min.finish()),
            Arc::new(max.finish()),
            Arc::new(level.finish()),
        ];
        Ok(RecordBatch::try_new(schema(), columns)?)
    }
}

#[async_trait]
impl TableProvider for FilesTable {
    fn schema(&self) -> SchemaRef {
        schema()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mem = MemTable::try_new(schema(), vec![vec![self.batch()?]])?;
        mem.scan(state, projection, filters, limit).await
    }
}
