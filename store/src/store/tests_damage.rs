//! Damage stays contained: a damaged WAL record, Delta commit or data file costs only what it
//! held, is named, and never stops the rest. Local disk and S3 (moto) alike.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use object_store::{ObjectStoreExt, PutPayload};

use super::tests::{Place, expected, open, powers, write_at, write_of};
use super::*;
use crate::clock::ManualClock;
use crate::ingest::MetricRow;
use crate::wal::FRAME_HEADER_V2;

const T0: i64 = 1_800_000_000_000_000_000;

macro_rules! on_both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn local() {
                super::$name(&super::Place::local())
            }
            #[test]
            fn s3() {
                super::$name(&super::Place::s3())
            }
        }
    )*};
}

on_both!(
    a_zero_byte_newest_commit_is_an_error_and_the_table_is_read_at_its_last_good_version,
    a_garbage_older_commit_hides_every_later_version_and_names_them,
    a_zero_byte_first_commit_of_one_table_leaves_the_others_serving,
    a_missing_empty_or_garbled_data_file_costs_only_its_rows,
    maintenance_skips_a_damaged_file_and_goes_on_with_every_other_hour,
);

/// Overwrites `rel` of the store's storage with `bytes` (local disk or S3).
pub(super) fn clobber(s: &Store, rel: &str, bytes: &[u8]) {
    let key = s.storage().key(rel).expect("key");
    let store = s.storage().root_store();
    let payload = PutPayload::from(bytes.to_vec());
    s.storage()
        .block(async move { store.put(&key, payload).await })
        .expect("runtime")
        .expect("overwrite");
}

fn commit(table: Table, version: u64) -> String {
    format!("tables/{}/_delta_log/{version:020}.json", table.name())
}

fn metric_write(i: usize) -> WriteBatch {
    let row = MetricRow {
        time: T0 + i as i64 * 1_000_000_000,
        metric: "m".into(),
        value: i as f64,
        labels: vec![("k".into(), format!("v{i}"))],
    };
    WriteBatch::from_rows(&[], &[row]).expect("batch")
}

fn metric_rows(s: &Store) -> usize {
    let snap = s.snapshot(Table::Metrics);
    let files: u64 = snap.files.iter().map(|(_, m)| m.rows).sum();
    snap.batches.iter().map(|b| b.num_rows()).sum::<usize>() + files as usize
}

/// The frames of a segment: `(start, end)` of each record.
fn frames(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 8;
    while at + FRAME_HEADER_V2 <= bytes.len() {
        let len = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let end = at + FRAME_HEADER_V2 + len as usize;
        out.push((at, end));
        at = end;
    }
    out
}

fn only_segment(p: &Place) -> std::path::PathBuf {
    let segs = wal::list_segments(&p.path().join("wal")).expect("list");
    assert_eq!(segs.len(), 1, "{segs:?}");
    segs[0].1.clone()
}

fn quarantined(p: &Place) -> Vec<(String, crate::quarantine::Note)> {
    let storage = Storage::local(p.path(), true).expect("storage");
    crate::quarantine::list(&storage, p.path()).expect("quarantine")
}

#[test]
fn a_flipped_wal_byte_costs_one_record_and_the_segment_is_quarantined_once_committed() {
    let p = Place::local();
    {
        let s = open(&p);
        for i in 0..200 {
            s.write(&write_of(i)).expect("write");
        }
    }
    let path = only_segment(&p);
    let mut bytes = std::fs::read(&path).expect("read");
    let (start, end) = frames(&bytes)[100];
    bytes[start + FRAME_HEADER_V2 + 40] ^= 0x10;
    std::fs::write(&path, &bytes).expect("write");

    let s = open(&p);
    let mut want = expected(200);
    want.remove(100);
    assert_eq!(powers(&s), want, "every record but the damaged one");
    assert_eq!(s.stats().wal_damaged_segments.load(Ordering::Relaxed), 1);
    assert_eq!(
        s.stats().wal_skipped_bytes.load(Ordering::Relaxed),
        (end - start) as u64
    );
    // Still in wal/: its replayed rows are not committed yet.
    assert!(path.exists());
    assert!(quarantined(&p).is_empty());
    s.persist().expect("persist");
    assert!(!path.exists(), "never deleted: moved");
    let q = quarantined(&p);
    assert_eq!(q.len(), 1, "{q:?}");
    assert!(
        q[0].0.ends_with("/wal/00000000000000000001.wal"),
        "{}",
        q[0].0
    );
    assert_eq!(std::fs::read(&q[0].0).expect("kept"), bytes);
    let d = &q[0].1.details;
    assert_eq!(d["records_replayed"], 199);
    assert_eq!(d["rows_replayed"]["gpu_metrics"], 199);
    assert_eq!(d["skipped_ranges"], serde_json::json!([[start, end]]));
    drop(s);
    let s = open(&p);
    assert_eq!(powers(&s), want, "nothing replayed twice after the move");
}

#[test]
fn a_zero_filled_4k_hole_costs_only_the_records_under_it() {
    let p = Place::local();
    {
        let s = open(&p);
        for i in 0..300 {
            s.write(&write_of(i)).expect("write");
        }
    }
    let path = only_segment(&p);
    let before = std::fs::read(&path).expect("read");
    let mut bytes = before.clone();
    // Across the end of record 150 and the start of record 151.
    let boundary = frames(&before)[150].1;
    let hole = boundary - 2048..boundary + 2048;
    bytes[hole].fill(0);
    std::fs::write(&path, &bytes).expect("write");
    // A record is lost when the hole changed any of its bytes (zeros over zeros change none).
    let lost: Vec<usize> = frames(&before)
        .iter()
        .enumerate()
        .filter(|(_, (a, b))| before[*a..*b] != bytes[*a..*b])
        .map(|(i, _)| i)
        .collect();
    assert!(lost.len() >= 2, "a 4 KiB hole spans records: {lost:?}");
    let s = open(&p);
    let want: Vec<f64> = (0..300)
        .filter(|i| !lost.contains(i))
        .map(|i| i as f64)
        .collect();
    assert_eq!(powers(&s), want);
}

fn a_zero_byte_newest_commit_is_an_error_and_the_table_is_read_at_its_last_good_version(p: &Place) {
    let clock = Arc::new(ManualClock::new(T0 + 3_600_000_000_000));
    let data_file = {
        let s = Store::open(p.config(), clock.clone()).expect("open");
        for i in 0..5 {
            s.write(&write_of(i)).expect("write");
        }
        s.persist().expect("persist");
        for i in 5..10 {
            s.write(&write_of(i)).expect("write");
        }
        let r = s.persist().expect("persist").expect("report");
        assert_eq!(s.table_versions()[&Table::GpuMetrics], Some(2));
        r.files[0].path.clone()
    };
    let s0 = Store::open(p.config(), clock.clone()).expect("reopen");
    clobber(&s0, &commit(Table::GpuMetrics, 2), b"");
    drop(s0);

    let s =
        Store::open(p.config(), clock.clone()).expect("a damaged table does not stop the store");
    let health = s.log_health(Table::GpuMetrics);
    assert_eq!((health.read_at, health.lost()), (Some(1), Some((2, 2))));
    assert!(
        health.bad[0].path.ends_with("00000000000000000002.json")
            && health.bad[0].problem == "is empty (0 bytes)",
        "{health:?}"
    );
    // Its rows are not read as an empty commit's: they are named as missing.
    assert_eq!(powers(&s), expected(5));
    let warnings = s.snapshot(Table::GpuMetrics).warnings;
    assert!(
        warnings.len() == 1 && warnings[0].text.contains("versions 2..=2 are not read"),
        "{warnings:?}"
    );
    // Writes are kept (WAL and buffer); the persist holds the table back; other tables commit.
    s.write(&write_of(10)).expect("write to the damaged table");
    s.write(&metric_write(1)).expect("write to another table");
    let r = s.persist().expect("persist").expect("report");
    assert_eq!(r.held_back, vec![Table::GpuMetrics]);
    assert_eq!(metric_rows(&s), 1);
    let segments = wal::list_segments(&p.path().join("wal"))
        .expect("list")
        .len();
    assert!(
        s.persist().expect("persist").is_none(),
        "only held-back rows: nothing to commit"
    );
    assert_eq!(
        wal::list_segments(&p.path().join("wal"))
            .expect("list")
            .len(),
        segments,
        "and no new segment for nothing"
    );
    assert_eq!(s.snapshot(Table::Metrics).files.len(), 1);
    assert!(
        wal::list_segments(&p.path().join("wal"))
            .expect("list")
            .iter()
            .any(|(seq, _)| *seq == r.wal_persisted_through),
        "the WAL keeps the held-back rows' segment"
    );
    // Maintenance never vacuums the unread version's data file.
    clock.advance(3 * 3_600_000_000_000);
    s.maintain().expect("maintain");
    assert!(s.storage().read(&data_file).is_ok(), "{data_file} kept");
    let mut want = expected(5);
    want.push(10.0);
    assert_eq!(powers(&s), want);
    drop(s);
    // After a restart the held-back row is replayed from the WAL again.
    let s = Store::open(p.config(), clock).expect("reopen");
    assert_eq!(powers(&s), want);
    assert_eq!(metric_rows(&s), 1);
}

fn a_garbage_older_commit_hides_every_later_version_and_names_them(p: &Place) {
    {
        let s = open(p);
        for round in 0..3 {
            for i in round * 4..round * 4 + 4 {
                s.write(&write_of(i)).expect("write");
            }
            s.persist().expect("persist");
        }
        assert_eq!(s.table_versions()[&Table::GpuMetrics], Some(3));
        clobber(
            &s,
            &commit(Table::GpuMetrics, 2),
            b"{\"add\":{\"pa\x00\x07garbage",
        );
    }
    let s = open(p);
    let health = s.log_health(Table::GpuMetrics);
    assert_eq!((health.read_at, health.lost()), (Some(1), Some((2, 3))));
    assert!(
        health.bad[0].problem.contains("line 1 is not JSON"),
        "{health:?}"
    );
    assert_eq!(powers(&s), expected(4));
    assert!(s.write(&write_of(20)).is_ok());
}

fn a_zero_byte_first_commit_of_one_table_leaves_the_others_serving(p: &Place) {
    {
        let s = open(p);
        s.write(&write_of(0)).expect("write");
        s.persist().expect("persist");
        clobber(&s, &commit(Table::Metrics, 0), b"");
    }
    let s = open(p);
    let health = s.log_health(Table::Metrics);
    assert_eq!((health.read_at, health.lost()), (None, Some((0, 0))));
    assert!(s.log_health(Table::GpuMetrics).bad.is_empty());
    assert_eq!(powers(&s), expected(1));
    s.write(&metric_write(3))
        .expect("kept in the WAL and the buffer");
    s.write(&write_of(1)).expect("write");
    let r = s.persist().expect("persist").expect("report");
    assert_eq!(r.held_back, vec![Table::Metrics]);
    assert_eq!(powers(&s), expected(2));
    assert_eq!(metric_rows(&s), 1);
    assert!(
        s.snapshot(Table::Metrics).warnings[0]
            .text
            .contains("no version is readable"),
        "{:?}",
        s.snapshot(Table::Metrics).warnings
    );
}

fn a_missing_empty_or_garbled_data_file_costs_only_its_rows(p: &Place) {
    let files = {
        let s = open(p);
        for hour in 0..3 {
            for i in hour * 10..hour * 10 + 10 {
                s.write(&write_at(i, 360)).expect("write");
            }
            s.persist().expect("persist");
        }
        let mut files = files_in(&s);
        files.sort_by_key(|f| f.min_time);
        assert_eq!(files.len(), 3);
        clobber(&s, &files[0].path, b"");
        let size = files[1].bytes as usize;
        clobber(&s, &files[1].path, &vec![0x5a; size]);
        files
    };
    let s = open(p);
    // The empty file is found at once (its size), by name, with its rows.
    let damaged = s.damaged_files();
    assert_eq!(damaged.len(), 1, "{damaged:?}");
    assert_eq!(
        (damaged[0].path.as_str(), damaged[0].rows),
        (files[0].path.as_str(), 10)
    );
    let snap = s.snapshot(Table::GpuMetrics);
    assert_eq!(snap.files.len(), 2);
    assert_eq!(
        snap.warnings
            .iter()
            .map(|w| w.text.clone())
            .collect::<Vec<_>>(),
        vec![format!(
            "skipped damaged file {} (10 rows): it is empty (0 bytes)",
            files[0].path
        )]
    );
    assert_eq!(
        (snap.warnings[0].min_time, snap.warnings[0].max_time),
        (files[0].min_time, files[0].max_time)
    );
    // The garbled one is found when a read fails on it.
    let locations: Vec<String> = snap.files.iter().map(|(l, _)| l.clone()).collect();
    let found = ReadStore::verify(&s, Table::GpuMetrics, &locations);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains(&files[1].path), "{found:?}");
    assert_eq!(s.snapshot(Table::GpuMetrics).files.len(), 1);
    assert_eq!(powers(&s), (20..30).map(|i| i as f64).collect::<Vec<_>>());
    assert_eq!(s.stats().damaged_files.load(Ordering::Relaxed), 2);
}

fn files_in(s: &Store) -> Vec<FileMeta> {
    s.files(Table::GpuMetrics).as_ref().clone()
}

fn maintenance_skips_a_damaged_file_and_goes_on_with_every_other_hour(p: &Place) {
    let clock = Arc::new(ManualClock::new(T0));
    let s = Store::open(p.config(), clock.clone()).expect("open");
    // Two hours, two files each.
    for slice in 0..4 {
        for i in slice * 60..(slice + 1) * 60 {
            s.write(&write_at(i, 30)).expect("write");
        }
        s.persist().expect("persist");
    }
    let mut files = files_in(&s);
    files.sort_by_key(|f| f.min_time);
    assert_eq!(files.len(), 4);
    let bad = files[0].clone();
    clobber(&s, &bad.path, &vec![0u8; bad.bytes as usize]);
    clock.advance(3 * 3_600_000_000_000);
    let r = s.maintain().expect("a damaged file never fails the pass");
    assert_eq!((r.windows_compacted, r.windows_skipped), (1, 1), "{r:?}");
    assert_eq!(
        s.damaged_files()
            .iter()
            .map(|d| d.path.clone())
            .collect::<Vec<_>>(),
        vec![bad.path.clone()]
    );
    let r = s.maintain().expect("maintain");
    assert_eq!(
        r.windows_compacted, 1,
        "the first hour, without the damaged file: {r:?}"
    );
    let raw = files_in(&s);
    assert_eq!(raw.len(), 3, "{raw:?}");
    assert!(
        raw.iter().any(|f| f.path == bad.path),
        "still named, never removed"
    );
    clock.advance(3 * 3_600_000_000_000);
    s.maintain().expect("vacuum");
    assert!(s.storage().read(&bad.path).is_ok(), "never vacuumed");
    assert_eq!(
        powers_readable(&s),
        (60..240).map(|i| i as f64).collect::<Vec<_>>()
    );
    assert_eq!(
        s.files(Table::GpuMetrics1h).len(),
        2,
        "both hours rolled up"
    );
}

/// `powers` over the files a snapshot reads (damaged ones left out).
fn powers_readable(s: &Store) -> Vec<f64> {
    powers(s)
}

fn check_config(p: &Place) -> crate::check::CheckConfig {
    let c = p.config();
    crate::check::CheckConfig {
        data_dir: c.data_dir,
        object_store: c.object_store,
        object_store_options: c.object_store_options,
        quick: false,
    }
}

fn kinds(r: &crate::check::Report) -> Vec<crate::check::Kind> {
    r.findings
        .iter()
        .filter(|f| f.damage)
        .map(|f| f.kind)
        .collect()
}

on_both!(
    repair_commits_again_the_files_of_a_lost_commit,
    repair_rebuilds_a_table_whose_first_commit_is_gone,
    repair_removes_a_damaged_data_file_and_keeps_it_in_quarantine,
);

fn repair_commits_again_the_files_of_a_lost_commit(p: &Place) {
    {
        let s = open(p);
        for round in 0..3 {
            for i in round * 5..round * 5 + 5 {
                s.write(&write_of(i)).expect("write");
            }
            s.persist().expect("persist");
        }
        clobber(&s, &commit(Table::GpuMetrics, 2), b"");
    }
    use crate::check::Kind;
    let cfg = check_config(p);
    let found = crate::check::check(&cfg).expect("check");
    assert!(found.damaged());
    assert_eq!(
        kinds(&found),
        vec![
            Kind::Commit,
            Kind::UnreadVersion,
            Kind::UnreadFile,
            Kind::UnreadFile
        ],
        "{found:#?}"
    );
    let unread: Vec<_> = found
        .findings
        .iter()
        .filter(|f| f.kind == Kind::UnreadFile)
        .collect();
    assert!(
        unread
            .iter()
            .all(|f| f.rows == Some(5) && f.action.starts_with("commit again"))
    );
    let gm = found
        .tables
        .iter()
        .find(|t| t.table == "gpu_metrics")
        .expect("table");
    assert_eq!((gm.read_at, gm.lost), (Some(1), Some([2, 3])));
    // A dry run changes nothing.
    let dry = crate::check::repair(&cfg, false).expect("dry run");
    assert!(!dry.applied);
    assert_eq!(
        kinds(&crate::check::check(&cfg).expect("check")),
        kinds(&found)
    );
    let done = crate::check::repair(&cfg, true).expect("repair");
    assert!(done.applied);
    let after = crate::check::check(&cfg).expect("check");
    assert!(!after.damaged(), "{after:#?}");
    assert_eq!(
        after
            .findings
            .iter()
            .filter(|f| f.kind == Kind::Quarantined)
            .count(),
        2,
        "the damaged commit and the version after it are kept in quarantine"
    );
    let s = open(p);
    assert_eq!(powers(&s), expected(15), "every row is back, none twice");
    assert!(s.log_health(Table::GpuMetrics).bad.is_empty());
    s.write(&write_of(15)).expect("write");
    assert!(
        s.persist()
            .expect("persist")
            .expect("report")
            .held_back
            .is_empty()
    );
    drop(s);
    assert_eq!(powers(&open(p)), expected(16));
}

fn repair_rebuilds_a_table_whose_first_commit_is_gone(p: &Place) {
    {
        let s = open(p);
        for i in 0..4 {
            s.write(&metric_write(i)).expect("write");
        }
        s.persist().expect("persist");
        clobber(&s, &commit(Table::Metrics, 0), b"");
    }
    let cfg = check_config(p);
    crate::check::repair(&cfg, true).expect("repair");
    assert!(!crate::check::check(&cfg).expect("check").damaged());
    let s = open(p);
    assert_eq!(metric_rows(&s), 4);
    assert!(!s.log_health(Table::Metrics).damaged());
}

fn repair_removes_a_damaged_data_file_and_keeps_it_in_quarantine(p: &Place) {
    let bad = {
        let s = open(p);
        for hour in 0..2 {
            for i in hour * 10..hour * 10 + 10 {
                s.write(&write_at(i, 360)).expect("write");
            }
            s.persist().expect("persist");
        }
        let mut files = files_in(&s);
        files.sort_by_key(|f| f.min_time);
        clobber(&s, &files[0].path, &vec![7u8; files[0].bytes as usize]);
        files[0].clone()
    };
    let cfg = check_config(p);
    let found = crate::check::check(&cfg).expect("check");
    let data: Vec<_> = found
        .findings
        .iter()
        .filter(|f| f.kind == crate::check::Kind::DataFile)
        .collect();
    assert_eq!(data.len(), 1, "{found:#?}");
    assert_eq!((data[0].rows, data[0].hour.is_some()), (Some(10), true));
    let quick = crate::check::check(&crate::check::CheckConfig {
        quick: true,
        ..cfg.clone()
    })
    .expect("quick");
    assert!(!quick.damaged(), "same size: only a full read finds it");
    crate::check::repair(&cfg, true).expect("repair");
    let after = crate::check::check(&cfg).expect("check");
    assert!(!after.damaged(), "{after:#?}");
    let s = open(p);
    assert!(s.damaged_files().is_empty());
    assert_eq!(powers(&s), (10..20).map(|i| i as f64).collect::<Vec<_>>());
    assert!(s.storage().read(&bad.path).is_err(), "moved away");
    let kept = after
        .findings
        .iter()
        .find(|f| f.kind == crate::check::Kind::Quarantined)
        .expect("in quarantine");
    assert!(kept.path.contains("/quarantine/"), "{}", kept.path);
}

on_both!(a_newest_commit_cut_at_a_line_boundary_is_caught_by_its_count);

/// A commit cut exactly between two lines still parses line by line; the count of file actions
/// its commitInfo announces tells it apart, so its files are never read as not being there.
fn a_newest_commit_cut_at_a_line_boundary_is_caught_by_its_count(p: &Place) {
    {
        let s = open(p);
        s.write(&write_of(0)).expect("write");
        s.persist().expect("persist");
        // Two hours in one persist: one commit adding two files.
        s.write(&write_at(1, 3600)).expect("write");
        s.write(&write_at(2, 3600)).expect("write");
        let r = s.persist().expect("persist").expect("report");
        assert_eq!(r.files.len(), 2);
        let rel = commit(Table::GpuMetrics, 2);
        let text = s.storage().read(&rel).expect("commit");
        let text = String::from_utf8(text.to_vec()).expect("utf-8");
        let kept: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect::<Vec<_>>();
        let last_add = kept
            .iter()
            .rposition(|l| l.starts_with("{\"add\""))
            .expect("an add");
        let cut = kept[..last_add].join("\n") + "\n";
        clobber(&s, &rel, cut.as_bytes());
    }
    let s = open(p);
    let health = s.log_health(Table::GpuMetrics);
    assert_eq!(health.lost(), Some((2, 2)), "{health:?}");
    assert!(
        health.bad[0]
            .problem
            .contains("1 of the 2 add/remove actions"),
        "{health:?}"
    );
    assert_eq!(powers(&s), expected(1));
}
