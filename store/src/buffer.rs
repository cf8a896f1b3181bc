//! The in-memory buffer: recent writes, queryable until they are persisted.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{RecordBatch, new_null_array};
use arrow::compute::concat_batches;

use crate::schema::Table;
use crate::{Result, ingest::WriteBatch};

/// Batches are merged in runs: once the newest batches include this many of the same level,
/// they become one batch of the next level. Each row is thus copied once per level (a handful of
/// times, however large the buffer grows) and a table holds at most this many batches per level,
/// which keeps scans cheap.
const MERGE_AT: usize = 64;

/// The buffered batches of one table.
#[derive(Debug, Default, Clone)]
pub struct TableBuffer {
    batches: Vec<RecordBatch>,
    /// Per batch: how many merges made it (0: as written).
    levels: Vec<u8>,
    rows: usize,
    bytes: usize,
}

impl TableBuffer {
    fn push(&mut self, table: Table, batch: RecordBatch) -> Result<()> {
        self.rows += batch.num_rows();
        self.bytes += batch.get_array_memory_size();
        self.batches.push(batch);
        self.levels.push(0);
        while let Some(&level) = self.levels.last() {
            let run = self
                .levels
                .iter()
                .rev()
                .take_while(|l| **l == level)
                .count();
            if run < MERGE_AT {
                break;
            }
            let from = self.batches.len() - run;
            let merged = concat_batches(&table.schema(), &self.batches[from..])?;
            let old: usize = self.batches[from..]
                .iter()
                .map(RecordBatch::get_array_memory_size)
                .sum();
            self.bytes = self.bytes.saturating_sub(old) + merged.get_array_memory_size();
            self.batches.truncate(from);
            self.levels.truncate(from);
            self.batches.push(merged);
            self.levels.push(level.saturating_add(1));
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
            old.levels.extend(now.levels);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::{MetricRow, WriteBatch};
    use arrow::array::AsArray;
    use arrow::datatypes::Float64Type;

    fn write(i: usize) -> WriteBatch {
        let row = MetricRow {
            time: i as i64,
            metric: "m".into(),
            value: i as f64,
            labels: vec![("k".into(), format!("{i}"))],
        };
        WriteBatch::from_rows(&[], &[row]).expect("batch")
    }

    fn values(b: &Buffers) -> Vec<f64> {
        b.batches(Table::Metrics)
            .iter()
            .flat_map(|rb| {
                rb.column_by_name("value")
                    .expect("value")
                    .as_primitive::<Float64Type>()
                    .values()
                    .to_vec()
            })
            .collect()
    }

    #[test]
    fn merges_in_levels_and_keeps_every_row_in_order() {
        let mut b = Buffers::default();
        let n = MERGE_AT * MERGE_AT + 2 * MERGE_AT + 5;
        for i in 0..n {
            b.push(&write(i)).expect("push");
        }
        // One batch of 64 x 64 rows, two of 64 rows, five as written.
        let sizes: Vec<usize> = b
            .batches(Table::Metrics)
            .iter()
            .map(RecordBatch::num_rows)
            .collect();
        let mut want = vec![MERGE_AT * MERGE_AT, MERGE_AT, MERGE_AT];
        want.extend([1; 5]);
        assert_eq!(sizes, want);
        assert_eq!(b.rows(), n);
        assert_eq!(values(&b), (0..n).map(|i| i as f64).collect::<Vec<_>>());
        let held: usize = b
            .batches(Table::Metrics)
            .iter()
            .map(RecordBatch::get_array_memory_size)
            .sum();
        assert_eq!(b.bytes(), held);

        // Older batches put in front (a failed persist) keep the order too.
        let mut older = Buffers::default();
        for i in 0..3 {
            older.push(&write(n + i)).expect("push");
        }
        let mut newer = Buffers::default();
        newer.push(&write(n + 3)).expect("push");
        newer.prepend(older);
        for i in 4..MERGE_AT + 4 {
            newer.push(&write(n + i)).expect("push");
        }
        assert_eq!(
            values(&newer),
            (n..n + MERGE_AT + 4).map(|i| i as f64).collect::<Vec<_>>()
        );
        assert_eq!(newer.batches(Table::Metrics).len(), 5);
    }
}
