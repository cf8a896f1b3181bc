//! Property tests: any sequence of records survives encode, append and replay; a log cut at any
//! byte replays exactly its whole records, and any one damaged stretch anywhere (flipped bits,
//! zeros, garbage, a 4 KiB hole, inserted bytes) costs exactly the records it touches.

use proptest::prelude::*;

use super::*;
use crate::ingest::{Cell, GpuRow, MetricRow, WriteBatch};
use crate::schema::{LABEL_COLUMNS, VALUE_COLUMNS};

fn replay(path: &Path) -> (Vec<Vec<u8>>, SegmentReport) {
    let mut got = Vec::new();
    let report = read_segment(path, |p| {
        got.push(p.to_vec());
        Ok(())
    })
    .expect("readable");
    (got, report)
}

fn write_segment(dir: &Path, records: &[Vec<u8>]) -> (PathBuf, Vec<u64>) {
    let mut wal = Wal::create(dir, 1).expect("create");
    let mut ends = vec![wal.bytes()];
    for r in records {
        ends.push(wal.append(r).expect("append").offset);
    }
    (segment_path(dir, 1), ends)
}

fn gpu_row() -> impl Strategy<Value = GpuRow> {
    (
        any::<i64>(),
        proptest::collection::vec(proptest::option::of("[a-z0-9-]{0,12}"), LABEL_COLUMNS.len()),
        proptest::collection::vec(
            proptest::option::of(prop_oneof![
                (-1e12f64..1e12).prop_map(Cell::F),
                any::<i64>().prop_map(Cell::I)
            ]),
            VALUE_COLUMNS.len(),
        ),
    )
        .prop_map(|(time, labels, values)| GpuRow {
            series_labels: None,
            job_shares: None,
            time,
            labels,
            values,
        })
}

fn metric_row() -> impl Strategy<Value = MetricRow> {
    (
        any::<i64>(),
        "[a-z_.]{1,20}",
        any::<f64>(),
        proptest::collection::btree_map("[a-z]{1,8}", "[ -~]{0,10}", 0..4),
    )
        .prop_map(|(time, metric, value, labels)| MetricRow {
            time,
            metric,
            value,
            labels: labels.into_iter().collect(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn payloads_round_trip(
        gpu in proptest::collection::vec(gpu_row(), 0..6),
        metrics in proptest::collection::vec(metric_row(), 0..6),
    ) {
        let write = WriteBatch::from_rows(&gpu, &metrics).expect("batch");
        let payload = encode_payload(&write).expect("encode");
        let back = decode_payload(&payload).expect("decode");
        prop_assert_eq!(back.batches.len(), write.batches.len());
        for ((t1, b1), (t2, b2)) in write.batches.iter().zip(&back.batches) {
            prop_assert_eq!(t1, t2);
            prop_assert_eq!(b1, b2);
        }
    }

    #[test]
    fn truncation_at_every_byte_replays_exactly_the_whole_records(
        records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 0..8),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, ends) = write_segment(dir.path(), &records);
        let full = fs::read(&path).expect("read");
        prop_assert_eq!(full.len() as u64, *ends.last().expect("end"));
        for cut in 0..=full.len() {
            fs::write(&path, &full[..cut]).expect("write");
            let (got, report) = replay(&path);
            let whole = ends.iter().filter(|e| **e <= cut as u64).count().saturating_sub(1);
            prop_assert_eq!(&got[..], &records[..whole], "cut at {}", cut);
            let kept = if cut < MAGIC.len() { 0 } else { ends[whole] };
            prop_assert_eq!(report.skipped_bytes(), cut as u64 - kept);
        }
    }

    /// Any one damaged stretch (flipped bits, zeros, garbage) costs exactly the records it
    /// touches: every other record is replayed, in order, and the skipped ranges cover the
    /// damaged records and nothing else.
    #[test]
    fn every_intact_record_survives_one_damaged_stretch(
        records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..300), 1..12),
        at in any::<prop::sample::Index>(),
        len in 1usize..600,
        kind in 0u8..3,
        fill in proptest::collection::vec(any::<u8>(), 600),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, ends) = write_segment(dir.path(), &records);
        let before = fs::read(&path).expect("read");
        let mut bytes = before.clone();
        let start = MAGIC.len() + at.index(bytes.len() - MAGIC.len());
        let end = (start + len).min(bytes.len());
        for (i, b) in bytes[start..end].iter_mut().enumerate() {
            *b = match kind {
                0 => *b ^ fill[i].max(1),
                1 => 0,
                _ => fill[i],
            };
        }
        fs::write(&path, &bytes).expect("write");
        let (got, report) = replay(&path);
        let (want, hit) = survivors(&records, &ends, &before, &bytes);
        prop_assert_eq!(&got[..], &want[..], "damage {}..{} kind {}", start, end, kind);
        prop_assert_eq!(report.skipped, hit);
    }

    /// A zero-filled 4 KiB hole over larger records: the records around it survive.
    #[test]
    fn a_zero_filled_4k_hole_costs_only_the_records_under_it(
        records in proptest::collection::vec(proptest::collection::vec(1u8..=255, 500..3000), 4..10),
        at in any::<prop::sample::Index>(),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, ends) = write_segment(dir.path(), &records);
        let before = fs::read(&path).expect("read");
        let mut bytes = before.clone();
        let start = MAGIC.len() + at.index(bytes.len() - MAGIC.len());
        let end = (start + 4096).min(bytes.len());
        bytes[start..end].fill(0);
        fs::write(&path, &bytes).expect("write");
        let (got, report) = replay(&path);
        let (want, hit) = survivors(&records, &ends, &before, &bytes);
        prop_assert_eq!(&got[..], &want[..]);
        prop_assert_eq!(report.skipped, hit);
    }

    /// Bytes inserted between records (a hole, then a copy of the log) are skipped, and every
    /// record on either side is replayed.
    #[test]
    fn inserted_garbage_between_records_is_skipped(
        records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 1..6),
        hole in proptest::collection::vec(any::<u8>(), 1..64),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, _) = write_segment(dir.path(), &records);
        let mut bytes = fs::read(&path).expect("read");
        let body = bytes[MAGIC.len()..].to_vec();
        let at = bytes.len() as u64;
        bytes.extend_from_slice(&hole);
        bytes.extend_from_slice(&body);
        fs::write(&path, &bytes).expect("write");
        let (got, report) = replay(&path);
        let twice: Vec<Vec<u8>> = records.iter().chain(&records).cloned().collect();
        prop_assert_eq!(&got[..], &twice[..]);
        prop_assert_eq!(report.skipped, vec![at..at + hole.len() as u64]);
    }
}

/// The records whose frames `after` leaves as they were in `before`, and the ranges a reader
/// skips: each changed record's frame, merged where they touch.
fn survivors(
    records: &[Vec<u8>],
    ends: &[u64],
    before: &[u8],
    after: &[u8],
) -> (Vec<Vec<u8>>, Vec<std::ops::Range<u64>>) {
    let mut want = Vec::new();
    let mut hit: Vec<std::ops::Range<u64>> = Vec::new();
    for (i, r) in records.iter().enumerate() {
        let (a, b) = (ends[i], ends[i + 1]);
        let frame = a as usize..b as usize;
        if before[frame.clone()] == after[frame] {
            want.push(r.clone());
            continue;
        }
        match hit.last_mut() {
            Some(last) if last.end == a => last.end = b,
            _ => hit.push(a..b),
        }
    }
    (want, hit)
}
