//! The write-ahead log: segment files of checksummed records.
//!
//! A segment is `<seq:020>.wal` holding an 8-byte magic (`GPUWAL02`) and then frames of
//! `[len: u32 LE][crc32(payload): u32 LE][crc32(the 8 bytes before): u32 LE][payload]`. Each
//! record is checked on its own, so replay keeps every valid record wherever damage is: a torn
//! tail (a crash mid-append), a flipped bit, a zero-filled hole or garbage costs only the
//! records it touches, and the reader scans forward for the next valid frame (`read.rs`).
//! Segments of earlier releases (`GPUWAL01`, frames without the header checksum) are read too.
//! Segments are only ever appended to by the process that created them; a new process starts a
//! new segment.
//!
//! Appending and making durable are separate steps: [`Wal::append`] writes a frame (no fsync) and
//! returns its end [`Position`]; [`GroupCommit`] then makes positions durable with one fsync shared
//! by every writer waiting at that moment (see `commit.rs`). A segment is closed when it grows
//! past its size limit or at a persist ([`Wal::rotate`]); rotation fsyncs the closed segment first,
//! so a durable position in segment `n` implies every earlier segment is durable too.

mod commit;
mod read;
pub mod record;

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use commit::{GroupCommit, SyncTarget};
pub use read::{SegmentReport, read_segment};
pub use record::{decode_payload, encode_payload};

use crate::{Error, Result};

/// The magic of the segments written now (frames with a header checksum).
const MAGIC: &[u8; 8] = b"GPUWAL02";
/// The magic of earlier releases' segments (frames without a header checksum).
const MAGIC_V1: &[u8; 8] = b"GPUWAL01";
/// A frame's header in segments of [`MAGIC`]: length, payload checksum, header checksum.
pub const FRAME_HEADER_V2: usize = 12;
/// A frame's header in segments of [`MAGIC_V1`]: length, payload checksum.
const FRAME_HEADER_V1: usize = 8;
/// Frames larger than this are taken as corruption.
const MAX_RECORD_BYTES: u32 = 1 << 30;

/// A point in the log: the end of a record in segment `seq`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    /// Segment number.
    pub seq: u64,
    /// Byte offset just past the record.
    pub offset: u64,
}

/// The open, appendable WAL.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    seq: u64,
    file: Arc<File>,
    bytes: u64,
    /// The segment may hold a half frame or unsynced pages whose fsync failed: the next append
    /// starts a new segment so that nothing is ever written after the damage.
    broken: bool,
}

impl Wal {
    /// Creates segment `seq` in `dir` and makes it the one appended to.
    pub fn create(dir: &Path, seq: u64) -> Result<Self> {
        fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let path = segment_path(dir, seq);
        let mut file = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        let made = file
            .write_all(MAGIC)
            .and_then(|()| file.sync_all())
            .map_err(|e| Error::io(&path, e))
            .and_then(|()| sync_dir(dir));
        if let Err(e) = made {
            // A segment without its magic would only confuse a later replay.
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            seq,
            file: Arc::new(file),
            bytes: MAGIC.len() as u64,
            broken: false,
        })
    }

    /// Sequence number of the segment being appended to.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Bytes in the current segment.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The end of the last record appended.
    pub fn position(&self) -> Position {
        Position {
            seq: self.seq,
            offset: self.bytes,
        }
    }

    /// What an fsync now would make durable.
    pub fn sync_target(&self) -> SyncTarget {
        SyncTarget {
            file: Arc::clone(&self.file),
            position: self.position(),
            path: segment_path(&self.dir, self.seq),
        }
    }

    /// True when the current segment is damaged and the next append starts a new one.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Marks segment `seq` as damaged (its fsync failed): later appends go to a new segment.
    pub fn mark_broken(&mut self, seq: u64) {
        if self.seq == seq {
            self.broken = true;
        }
    }

    /// Appends one record (not fsynced: see [`GroupCommit`]) and returns its end position.
    pub fn append(&mut self, payload: &[u8]) -> Result<Position> {
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|l| *l > 0 && *l <= MAX_RECORD_BYTES)
            .ok_or(Error::TooLarge {
                limit: MAX_RECORD_BYTES as usize,
            })?;
        if self.broken {
            self.rotate()?;
        }
        let mut frame = Vec::with_capacity(FRAME_HEADER_V2 + payload.len());
        frame.extend_from_slice(&len.to_le_bytes());
        frame.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        let header_crc = crc32fast::hash(&frame[..8]);
        frame.extend_from_slice(&header_crc.to_le_bytes());
        frame.extend_from_slice(payload);
        // Written at the known end, not the file cursor: after a failed append was cut back the
        // cursor would point past the end and leave a hole of zeros.
        if let Err(e) = self.file.write_all_at(&frame, self.bytes) {
            // Leave no half frame behind for this process's later appends to follow; if even
            // that fails, never append to this segment again.
            if self.file.set_len(self.bytes).is_err() {
                self.broken = true;
            }
            return Err(Error::io(segment_path(&self.dir, self.seq), e));
        }
        self.bytes += frame.len() as u64;
        Ok(self.position())
    }

    /// Fsyncs the current segment, closes it and starts the next. Returns the closed segment's
    /// number. On error nothing changes.
    pub fn rotate(&mut self) -> Result<u64> {
        let closed = self.seq;
        if let Err(e) = self.file.sync_data() {
            // A broken segment's records are never acknowledged (see `GroupCommit::fail`), so a
            // failed fsync of it must not keep the log from moving on.
            if !self.broken {
                return Err(Error::io(segment_path(&self.dir, closed), e));
            }
        }
        let next = Wal::create(&self.dir, closed + 1)?;
        *self = next;
        Ok(closed)
    }
}

/// The file name of segment `seq`.
pub fn segment_name(seq: u64) -> String {
    format!("{seq:020}.wal")
}

/// The path of segment `seq`.
pub fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(segment_name(seq))
}

/// Every segment in `dir`, in order.
pub fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".wal")) else {
            continue;
        };
        if let Ok(seq) = stem.parse::<u64>() {
            out.push((seq, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Fsyncs a directory so that file creations and renames in it are durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payloads(path: &Path) -> (Vec<Vec<u8>>, SegmentReport) {
        let mut got = Vec::new();
        let report = read_segment(path, |p| {
            got.push(p.to_vec());
            Ok(())
        })
        .expect("readable");
        (got, report)
    }

    #[test]
    fn append_rotate_and_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = Wal::create(dir.path(), 1).expect("create");
        wal.append(b"one").expect("append");
        assert!(wal.append(b"").is_err(), "no empty records");
        wal.append(b"two").expect("append");
        assert_eq!(wal.rotate().expect("rotate"), 1);
        wal.append(b"three").expect("append");
        let segs = list_segments(dir.path()).expect("list");
        assert_eq!(segs.iter().map(|s| s.0).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(
            payloads(&segs[0].1).0,
            vec![b"one".to_vec(), b"two".to_vec()]
        );
        assert_eq!(payloads(&segs[1].1).0, vec![b"three".to_vec()]);
    }

    #[test]
    fn truncation_at_every_byte_keeps_every_whole_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records: Vec<Vec<u8>> = (0..6u8).map(|i| vec![i; usize::from(i) * 7 + 1]).collect();
        let mut wal = Wal::create(dir.path(), 7).expect("create");
        let mut ends = vec![MAGIC.len() as u64];
        for r in &records {
            wal.append(r).expect("append");
            ends.push(wal.bytes());
        }
        let path = segment_path(dir.path(), 7);
        let full = fs::read(&path).expect("read");
        for cut in 0..=full.len() {
            fs::write(&path, &full[..cut]).expect("write");
            let (got, report) = payloads(&path);
            let whole = ends
                .iter()
                .filter(|e| **e <= cut as u64)
                .count()
                .saturating_sub(1);
            assert_eq!(got, records[..whole].to_vec(), "cut at {cut}");
            assert_eq!(report.records, whole as u64);
        }
    }

    #[test]
    fn a_flipped_byte_costs_only_its_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = Wal::create(dir.path(), 1).expect("create");
        for r in [b"aaaa", b"bbbb", b"cccc"] {
            wal.append(r).expect("append");
        }
        let path = segment_path(dir.path(), 1);
        let mut bytes = fs::read(&path).expect("read");
        let frame = (FRAME_HEADER_V2 + 4) as u64;
        let second = 8 + frame;
        bytes[second as usize + FRAME_HEADER_V2] ^= 0xff;
        fs::write(&path, &bytes).expect("write");
        let (got, report) = payloads(&path);
        assert_eq!(got, vec![b"aaaa".to_vec(), b"cccc".to_vec()]);
        assert_eq!(report.skipped, vec![second..second + frame]);
        assert_eq!(
            report.ranges_text(),
            format!("{second}..{}", second + frame)
        );
    }

    /// Segments written by earlier releases (no header checksum) are read, damage included.
    #[test]
    fn earlier_release_segments_are_read_and_resynced() {
        use crate::ingest::{GpuRow, WriteBatch};
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("00000000000000000001.wal");
        let mut bytes = MAGIC_V1.to_vec();
        let mut starts = Vec::new();
        for i in 0..3i64 {
            let write = WriteBatch::from_rows(&[GpuRow::new(i)], &[]).expect("batch");
            let payload = encode_payload(&write).expect("encode");
            starts.push(bytes.len());
            bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
            bytes.extend_from_slice(&payload);
        }
        bytes[starts[1] + 20] ^= 0x5a;
        fs::write(&path, &bytes).expect("write");
        let (got, report) = payloads(&path);
        assert_eq!((got.len(), report.format), (2, 1));
        assert_eq!(report.skipped, vec![starts[1] as u64..starts[2] as u64]);
        let times: Vec<i64> = got
            .iter()
            .map(|p| {
                let w = decode_payload(p).expect("decode");
                w.batches[0]
                    .1
                    .column(0)
                    .as_any()
                    .downcast_ref::<arrow::array::TimestampNanosecondArray>()
                    .expect("times")
                    .value(0)
            })
            .collect();
        assert_eq!(times, vec![0, 2]);
    }
}

#[cfg(test)]
mod tests_prop;
