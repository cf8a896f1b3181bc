//! The payload of a WAL record: the batches of one write, as Arrow IPC streams.
//!
//! `[count: u16 LE]` then, per batch, `[table id: u8][len: u32 LE][Arrow IPC stream]`.

use std::io::Cursor;

use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;

use crate::ingest::WriteBatch;
use crate::schema::Table;
use crate::{Error, Result};

/// Encodes a write for the WAL.
pub fn encode_payload(batch: &WriteBatch) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let count = u16::try_from(batch.batches.len())
        .map_err(|_| Error::malformed("write", "too many tables"))?;
    out.extend_from_slice(&count.to_le_bytes());
    for (table, rb) in &batch.batches {
        let mut ipc = Vec::new();
        {
            let mut w = StreamWriter::try_new(&mut ipc, rb.schema_ref())?;
            w.write(rb)?;
            w.finish()?;
        }
        out.push(table.id());
        let len = u32::try_from(ipc.len()).map_err(|_| Error::TooLarge {
            limit: u32::MAX as usize,
        })?;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&ipc);
    }
    Ok(out)
}

/// Decodes a WAL payload back into the write it carried.
pub fn decode_payload(payload: &[u8]) -> Result<WriteBatch> {
    let bad = |d: &str| Error::malformed("wal record", d);
    let count = payload.get(0..2).ok_or_else(|| bad("short header"))?;
    let count = u16::from_le_bytes([count[0], count[1]]);
    let mut pos = 2usize;
    let mut batches = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let head = payload
            .get(pos..pos + 5)
            .ok_or_else(|| bad("short batch header"))?;
        let table = Table::from_id(head[0]).ok_or_else(|| bad("unknown table id"))?;
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
        pos += 5;
        let ipc = payload
            .get(pos..pos + len)
            .ok_or_else(|| bad("short batch"))?;
        pos += len;
        let reader = StreamReader::try_new(Cursor::new(ipc), None)?;
        for rb in reader {
            let rb = rb?;
            // Batches written by an older schema version gain the new columns as nulls.
            let rb = crate::buffer::conform(table, rb)?;
            batches.push((table, rb));
        }
    }
    Ok(WriteBatch { batches })
}

/// True when `head` (the first 7 bytes of a payload of `len` bytes) can start a write: a batch
/// count, a known table id and a first batch that fits. Used to scan segments of the format
/// without a header checksum for their next record cheaply.
pub(super) fn plausible_start(head: &[u8], len: u32) -> bool {
    let [c0, c1, table, l0, l1, l2, l3, ..] = *head else {
        return false;
    };
    let count = u16::from_le_bytes([c0, c1]);
    let first = u32::from_le_bytes([l0, l1, l2, l3]);
    (1..=1024).contains(&count)
        && Table::from_id(table).is_some()
        && u64::from(first) + 7 <= u64::from(len)
}
