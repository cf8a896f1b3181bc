//! The in-memory buffer: recent writes, queryable until they are persisted.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch, TimestampNanosecondArray, new_null_array};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, TimeUnit, TimestampNanosecondType};

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

    /// Approximate memory held, in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
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
        self.push_where(write, |_| true).map(|_| ())
    }

    /// Adds the batches of one write whose table passes `keep` (WAL replay skips the tables
    /// whose commits already cover the segment). Returns how many rows were added.
    pub fn push_where(
        &mut self,
        write: &WriteBatch,
        keep: impl Fn(Table) -> bool,
    ) -> Result<usize> {
        let mut added = 0;
        for (table, batch) in &write.batches {
            if batch.num_rows() > 0 && keep(*table) {
                added += batch.num_rows();
                self.tables
                    .entry(*table)
                    .or_default()
                    .push(*table, to_micros(batch)?)?;
            }
        }
        Ok(added)
    }

    /// Takes one table's batches out.
    pub fn take(&mut self, table: Table) -> Buffers {
        let mut out = Buffers::default();
        if let Some(t) = self.tables.remove(&table) {
            out.tables.insert(table, t);
        }
        out
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

/// `batch` with every nanosecond timestamp cut to whole microseconds (Delta tables hold
/// microseconds, so a row reads the same before and after it is persisted).
pub fn to_micros(batch: &RecordBatch) -> Result<RecordBatch> {
    let mut columns = batch.columns().to_vec();
    let mut changed = false;
    for c in columns.iter_mut() {
        let DataType::Timestamp(TimeUnit::Nanosecond, tz) = c.data_type() else {
            continue;
        };
        let a = c.as_primitive::<TimestampNanosecondType>();
        if a.values().iter().all(|v| v % 1000 == 0) {
            continue;
        }
        let cut: TimestampNanosecondArray = a
            .unary::<_, TimestampNanosecondType>(|v| v.div_euclid(1000) * 1000)
            .with_timezone_opt(tz.clone());
        debug_assert_eq!(cut.null_count(), a.null_count());
        *c = Arc::new(cut);
        changed = true;
    }
    if !changed {
        return Ok(batch.clone());
    }
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
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
    use arrow::datatypes::{Float64Type, TimestampNanosecondType};

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
    fn times_are_kept_to_whole_microseconds() {
        let mut b = Buffers::default();
        let mut w = write(0);
        w.batches[0].1 = {
            let row = MetricRow {
                time: 1_795_554_004_039_826_770,
                metric: "m".into(),
                value: 1.0,
                labels: vec![],
            };
            WriteBatch::from_rows(&[], &[row]).expect("batch").batches[0]
                .1
                .clone()
        };
        b.push(&w).expect("push");
        let t = b.batches(Table::Metrics)[0]
            .column(0)
            .as_primitive::<TimestampNanosecondType>()
            .value(0);
        assert_eq!(t, 1_795_554_004_039_826_000);
        let mut other = Buffers::default();
        assert_eq!(
            other.push_where(&w, |t| t != Table::Metrics).expect("push"),
            0
        );
        assert!(other.is_empty());
        let taken = b.take(Table::Metrics);
        assert!(b.is_empty());
        assert_eq!(taken.rows(), 1);
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
