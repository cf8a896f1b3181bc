//! The in-memory buffer: recent writes, queryable until they are persisted.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{RecordBatch, new_null_array};
use arrow::compute::concat_batches;

use crate::schema::Table;
use crate::{Result, ingest::WriteBatch};

/// Batches are merged once a table holds this many, to keep scans cheap.
const MERGE_AT: usize = 64;

/// The buffered batches of one table.
#[derive(Debug, Default, Clone)]
pub struct TableBuffer {
    batches: Vec<RecordBatch>,
    rows: usize,
    bytes: usize,
}

impl TableBuffer {
    fn push(&mut self, table: Table, batch: RecordBatch) -> Result<()> {
        self.rows += batch.num_rows();
        self.bytes += batch.get_array_memory_size();
        self.batches.push(batch);
        if self.batches.len() >= MERGE_AT {
            let merged = concat_batches(&table.schema(), &self.batches)?;
            self.bytes = merged.get_array_memory_size();
            self.batches = vec![merged];
        }
        Ok(())
    }

    /// The batches, oldest first.
    pub fn batches(&self) -> &[RecordBatch] {
        &self.batches
    }
}

/// The buffered batches of every table.
#[derive(Debug, Default, Clone)]
pub struct Buffers {
    tables: BTreeMap<Table, TableBuffer>,
}

impl Buffers {
    /// Adds one write.
    pub fn push(&mut self, write: &WriteBatch) -> Result<()> {
        for (table, batch) in &write.batches {
            if batch.num_rows() > 0 {
                self.tables
                    .entry(*table)
                    .or_default()
                    .push(*table, batch.clone())?;
            }
        }
        Ok(())
    }

    /// The batches of one table.
    pub fn batches(&self, table: Table) -> &[RecordBatch] {
        self.tables.get(&table).map(|t| t.batches()).unwrap_or(&[])
    }

    /// Rows over all tables.
    pub fn rows(&self) -> usize {
        self.tables.values().map(|t| t.rows).sum()
    }

    /// Approximate memory held, in bytes.
    pub fn bytes(&self) -> usize {
        self.tables.values().map(|t| t.bytes).sum()
    }

    /// True when nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.rows() == 0
    }

    /// Tables with rows.
    pub fn tables(&self) -> impl Iterator<Item = (Table, &TableBuffer)> {
        self.tables
            .iter()
            .filter(|(_, b)| b.rows > 0)
            .map(|(t, b)| (*t, b))
    }

    /// Puts `older` in front of what is buffered now (used when a persist fails).
    pub fn prepend(&mut self, older: Buffers) {
        for (table, mut old) in older.tables {
            let now = self.tables.remove(&table).unwrap_or_default();
            old.rows += now.rows;
            old.bytes += now.bytes;
            old.batches.extend(now.batches);
            self.tables.insert(table, old);
        }
    }
}

/// Brings a batch to the table's current schema: columns matched by name, missing ones null.
pub fn conform(table: Table, batch: RecordBatch) -> Result<RecordBatch> {
    let schema = table.schema();
    if batch.schema_ref().as_ref() == schema.as_ref() {
        return Ok(batch);
    }
    let columns = schema
        .fields()
        .iter()
        .map(|f| match batch.column_by_name(f.name()) {
            Some(c) if c.data_type() == f.data_type() => Arc::clone(c),
            _ => new_null_array(f.data_type(), batch.num_rows()),
        })
        .collect();
    Ok(RecordBatch::try_new(schema, columns)?)
}
