use super::*;

struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("gpuwatch-spool-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        Dir(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn item(seq: u64, size: usize) -> Encoded {
    Encoded {
        seq,
        body: (0..size).map(|i| (seq as usize + i) as u8).collect(),
    }
}

fn drain(s: &mut DiskSpool) -> Vec<u64> {
    let mut out = Vec::new();
    while let Some(e) = s.front().cloned() {
        let popped = s.pop_front().unwrap();
        assert_eq!(popped, e);
        assert_eq!(
            popped,
            item(e.seq, popped.body.len()),
            "body of {} changed",
            e.seq
        );
        out.push(e.seq);
    }
    out
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with("seg-"))
        .collect();
    v.sort();
    v
}

#[test]
fn order_survives_reopen_and_acknowledged_requests_are_not_replayed() {
    let d = Dir::new("order");
    {
        let mut s = DiskSpool::open(&d.0, 1 << 20).unwrap();
        for seq in 0..10 {
            assert!(s.push(item(seq, 300)).is_none());
        }
        assert_eq!(s.len(), 10);
        assert_eq!(s.bytes(), 10 * (HEADER + 300));
        // Three were delivered before the agent died.
        for want in 0..3 {
            assert_eq!(s.pop_front().unwrap().seq, want);
        }
    } // dropped without any shutdown step, like kill -9
    let mut s = DiskSpool::open(&d.0, 1 << 20).unwrap();
    assert_eq!(s.len(), 7);
    assert_eq!(s.last_seq(), Some(9));
    s.push(item(10, 50));
    assert_eq!(drain(&mut s), (3..=10).collect::<Vec<_>>());
    assert!(
        segment_files(&d.0).is_empty(),
        "consumed segments are deleted"
    );
    drop(s);
    // Empty now, but the numbering goes on after the acknowledged requests.
    let s = DiskSpool::open(&d.0, 1 << 20).unwrap();
    assert_eq!(s.len(), 0);
    assert_eq!(s.last_seq(), Some(10));
}

#[test]
fn full_spool_drops_the_oldest_and_counts_them() {
    let d = Dir::new("full");
    let max = 64 << 10;
    let mut s = DiskSpool::open(&d.0, max).unwrap();
    for seq in 0..400 {
        s.push(item(seq, 1000));
        let on_disk: u64 = segment_files(&d.0)
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum();
        assert!(
            on_disk <= max,
            "{on_disk} bytes on disk over the bound {max}"
        );
    }
    assert!(s.dropped() > 300, "dropped {}", s.dropped());
    let kept = drain(&mut s);
    assert_eq!(kept.len() as u64 + s.dropped(), 400);
    // What is kept is the newest, in order, without holes.
    assert_eq!(*kept.last().unwrap(), 399);
    assert!(kept.windows(2).all(|w| w[1] == w[0] + 1), "{kept:?}");
}

#[test]
fn a_torn_tail_is_cut_and_the_rest_replayed() {
    let d = Dir::new("torn");
    {
        let mut s = DiskSpool::open(&d.0, 1 << 20).unwrap();
        for seq in 0..5 {
            s.push(item(seq, 200));
        }
    }
    let last = segment_files(&d.0).pop().unwrap();
    let good = std::fs::metadata(&last).unwrap().len();
    // Half a record: a crash in the middle of a write.
    let mut f = OpenOptions::new().append(true).open(&last).unwrap();
    f.write_all(&[200, 0, 0, 0, 1, 2, 3, 4, 5, 0, 0, 0, 0, 0, 0, 0, 9, 9])
        .unwrap();
    drop(f);
    let mut s = DiskSpool::open(&d.0, 1 << 20).unwrap();
    assert_eq!(std::fs::metadata(&last).unwrap().len(), good);
    s.push(item(5, 10));
    assert_eq!(drain(&mut s), vec![0, 1, 2, 3, 4, 5]);
}

#[test]
fn a_corrupt_record_is_skipped_not_replayed() {
    let d = Dir::new("corrupt");
    {
        // Small segments: several files.
        let mut s = DiskSpool::open(&d.0, 64 << 10).unwrap();
        for seq in 0..12 {
            s.push(item(seq, 1500));
        }
    }
    let files = segment_files(&d.0);
    assert!(files.len() >= 3, "{files:?}");
    // Flip a byte in the body of the first record of the second segment.
    let mut data = std::fs::read(&files[1]).unwrap();
    data[HEADER as usize + 3] ^= 0xff;
    std::fs::write(&files[1], data).unwrap();
    let mut s = DiskSpool::open(&d.0, 64 << 10).unwrap();
    let kept = drain(&mut s);
    assert!(s.dropped() >= 1);
    assert!(kept.windows(2).all(|w| w[0] < w[1]), "{kept:?}");
    assert_eq!(*kept.first().unwrap(), 0);
    assert_eq!(*kept.last().unwrap(), 11);
    assert!(kept.len() < 12);
}

#[test]
fn one_agent_per_directory() {
    let d = Dir::new("lock");
    let _s = DiskSpool::open(&d.0, 1 << 20).unwrap();
    let e = DiskSpool::open(&d.0, 1 << 20).unwrap_err();
    assert!(e.to_string().contains("own --buffer-dir"), "{e}");
}

#[test]
fn peek_reads_a_batch_across_segments_and_reopen() {
    let d = Dir::new("peek");
    {
        // 4 KiB segments: 30 records of 300 bytes span several of them.
        let mut s = DiskSpool::open(&d.0, 64 << 10).unwrap();
        for seq in 0..30 {
            s.push(item(seq, 300));
        }
        assert!(segment_files(&d.0).len() > 1);
        let batch = s.peek(20, 1 << 20);
        assert_eq!(
            batch.iter().map(|e| e.seq).collect::<Vec<_>>(),
            (0..20).collect::<Vec<_>>()
        );
        for e in &batch {
            assert_eq!(*e, item(e.seq, 300), "body of {} changed", e.seq);
        }
        // The byte bound: 3 bodies of 300 fit in 900, the 4th does not.
        assert_eq!(s.peek(20, 900).len(), 3);
        assert_eq!(s.len(), 30, "peek consumes nothing");
        for _ in 0..5 {
            s.pop_front();
        }
    }
    let s = DiskSpool::open(&d.0, 64 << 10).unwrap();
    assert_eq!(
        s.peek(4, 1 << 20).iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![5, 6, 7, 8]
    );
}
