//! Property tests: any sequence of records survives encode, append and replay; a log cut at any
//! byte or damaged anywhere replays exactly a prefix of whole records.

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
            prop_assert_eq!(report.torn_bytes, cut as u64 - kept);
        }
    }

    #[test]
    fn a_zero_filled_hole_ends_replay(
        records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 1..6),
        hole in 1usize..64,
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, _) = write_segment(dir.path(), &records);
        let mut bytes = fs::read(&path).expect("read");
        bytes.extend(std::iter::repeat_n(0u8, hole));
        let again = bytes[8..].to_vec();
        bytes.extend_from_slice(&again);
        fs::write(&path, &bytes).expect("write");
        let (got, report) = replay(&path);
        prop_assert_eq!(&got[..], &records[..]);
        prop_assert!(report.torn_bytes >= hole as u64);
    }

    #[test]
    fn a_damaged_byte_replays_a_prefix_and_nothing_after_the_damage(
        records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 1..8),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, ends) = write_segment(dir.path(), &records);
        let mut bytes = fs::read(&path).expect("read");
        let i = at.index(bytes.len());
        bytes[i] ^= flip;
        fs::write(&path, &bytes).expect("write");
        let (got, _) = replay(&path);
        // Every record that ends before the damaged byte is kept, and nothing after it: a
        // crc32 catches any change of one byte, and a changed length fails the crc or runs past
        // the end. Damage in the magic drops the segment.
        let intact = ends.iter().filter(|e| **e <= i as u64).count().saturating_sub(1);
        let want = if i < MAGIC.len() { 0 } else { intact };
        prop_assert_eq!(&got[..], &records[..want], "damage at {}", i);
    }
}
