//! The disk spool of `--buffer-dir`: a bounded, ordered, crash-safe FIFO of encoded export
//! requests, behind the same [`Spool`] trait as the in-memory queue.
//!
//! # Layout
//!
//! ```text
//! <buffer-dir>/
//!   LOCK                         held (File::try_lock) while an agent uses the directory
//!   ack                          the seq of the last request delivered (or dropped), as text
//!   seg-<first seq, 20 digits>   segments, appended in order, deleted once fully consumed
//! ```
//!
//! A segment is a sequence of records:
//!
//! ```text
//! len: u32 LE | crc32: u32 LE | seq: u64 LE | body: len bytes     (crc over seq and body)
//! ```
//!
//! Each push appends one record and `sync_data`s the segment, so a request the agent queued
//! survives `kill -9` and power loss. Delivered requests are acknowledged by rewriting `ack`
//! (write to `ack.tmp`, rename), so a restart does not send them again; a segment whose records
//! are all acknowledged is deleted.
//!
//! On open, every segment is read and every record checked: a record with a bad length or
//! checksum ends its segment (a torn write at the tail of the last segment, cut off with
//! `set_len`; elsewhere the rest of that segment is skipped and counted as dropped). Records at
//! or below `ack` are skipped. What remains is replayed in `seq` order.
//!
//! The bound `max_bytes` covers every segment file on disk. When a push would cross it, the
//! oldest requests are dropped (counted in [`Spool::dropped`]) until it fits. A write error
//! (disk full, permissions) drops the new request with a warning and counts it.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use tracing::{debug, info, warn};

use crate::error::{Error, Result};
use crate::export::queue::{Encoded, Spool};

/// Bytes of a record header: len, crc, seq.
const HEADER: u64 = 16;
/// Largest body accepted (a request of a 1024-GPU host is well under this).
const MAX_BODY: u64 = 64 << 20;

/// Where one queued record lives.
#[derive(Debug, Clone, Copy)]
struct Entry {
    seq: u64,
    segment: u64,
    offset: u64,
    len: u64,
}

/// One segment file.
#[derive(Debug)]
struct Segment {
    id: u64,
    size: u64,
}

/// The disk spool.
#[derive(Debug)]
pub struct DiskSpool {
    dir: PathBuf,
    max_bytes: u64,
    segment_max: u64,
    entries: VecDeque<Entry>,
    segments: VecDeque<Segment>,
    front: Option<Encoded>,
    writer: Option<File>,
    disk_bytes: u64,
    live_bytes: u64,
    acked: Option<u64>,
    last_seq: Option<u64>,
    dropped: u64,
    _lock: File,
}

fn segment_name(id: u64) -> String {
    format!("seg-{id:020}")
}

fn checksum(seq: u64, body: &[u8]) -> u32 {
    let mut crc = flate2::Crc::new();
    crc.update(&seq.to_le_bytes());
    crc.update(body);
    crc.sum()
}

impl DiskSpool {
    /// Open (or create) the spool in `dir`, holding at most `max_bytes` on disk.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<Self> {
        let fail = |message: String| Error::Spool {
            path: dir.to_path_buf(),
            message,
        };
        std::fs::create_dir_all(dir)
            .map_err(|e| fail(format!("{e}; check --buffer-dir and its permissions")))?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("LOCK"))
            .map_err(|e| fail(format!("cannot create LOCK: {e}")))?;
        lock.try_lock().map_err(|_| {
            fail(
                "another gpuwatch-agent uses this directory: give each agent its own --buffer-dir"
                    .into(),
            )
        })?;
        let acked = match std::fs::read_to_string(dir.join("ack")) {
            Ok(t) => t.trim().parse::<u64>().ok(),
            Err(_) => None,
        };
        let mut spool = DiskSpool {
            dir: dir.to_path_buf(),
            max_bytes,
            segment_max: (max_bytes / 16).clamp(4 << 10, 16 << 20),
            entries: VecDeque::new(),
            segments: VecDeque::new(),
            front: None,
            writer: None,
            disk_bytes: 0,
            live_bytes: 0,
            acked,
            last_seq: acked,
            dropped: 0,
            _lock: lock,
        };
        spool
            .recover()
            .map_err(|e| fail(format!("{e}; move the directory away to start empty")))?;
        spool.collect_garbage();
        spool.load_front();
        if !spool.entries.is_empty() {
            info!(
                dir = %dir.display(),
                requests = spool.entries.len(),
                bytes = spool.live_bytes,
                "disk spool: replaying requests kept from before"
            );
        }
        Ok(spool)
    }

    fn recover(&mut self) -> std::io::Result<()> {
        let mut ids: Vec<u64> = std::fs::read_dir(&self.dir)?
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_prefix("seg-")?
                    .parse::<u64>()
                    .ok()
            })
            .collect();
        ids.sort_unstable();
        let count = ids.len();
        for (i, id) in ids.into_iter().enumerate() {
            let path = self.dir.join(segment_name(id));
            let mut data = Vec::new();
            File::open(&path)?.read_to_end(&mut data)?;
            let mut offset = 0u64;
            let total = data.len() as u64;
            while offset + HEADER <= total {
                let at = offset as usize;
                let len = u64::from(u32::from_le_bytes([
                    data[at],
                    data[at + 1],
                    data[at + 2],
                    data[at + 3],
                ]));
                let crc =
                    u32::from_le_bytes([data[at + 4], data[at + 5], data[at + 6], data[at + 7]]);
                let mut seq_bytes = [0u8; 8];
                seq_bytes.copy_from_slice(&data[at + 8..at + 16]);
                let seq = u64::from_le_bytes(seq_bytes);
                if len > MAX_BODY || offset + HEADER + len > total {
                    break;
                }
                let body = &data[at + 16..at + 16 + len as usize];
                if checksum(seq, body) != crc {
                    break;
                }
                let in_order = self.entries.back().is_none_or(|e| e.seq < seq);
                if in_order && self.acked.is_none_or(|a| seq > a) {
                    self.entries.push_back(Entry {
                        seq,
                        segment: id,
                        offset,
                        len,
                    });
                    self.live_bytes += HEADER + len;
                }
                self.last_seq = Some(self.last_seq.map_or(seq, |l| l.max(seq)));
                offset += HEADER + len;
            }
            if offset < total {
                if i + 1 == count {
                    warn!(segment = %path.display(), kept = offset, cut = total - offset, "disk spool: cutting a torn record at the end");
                    OpenOptions::new()
                        .write(true)
                        .open(&path)?
                        .set_len(offset)?;
                } else {
                    warn!(segment = %path.display(), skipped_bytes = total - offset, "disk spool: corrupt record, skipping the rest of the segment");
                    self.dropped += 1;
                }
            }
            let size = if i + 1 == count { offset } else { total };
            self.disk_bytes += size;
            self.segments.push_back(Segment { id, size });
        }
        Ok(())
    }

    /// Delete head segments whose records are all consumed.
    fn collect_garbage(&mut self) {
        let first_live = self.entries.front().map(|e| e.segment);
        while self.segments.len() > 1 || (self.entries.is_empty() && !self.segments.is_empty()) {
            let Some(head) = self.segments.front() else {
                break;
            };
            if first_live.is_some_and(|s| s <= head.id) {
                break;
            }
            let is_writer = self.segments.len() == 1;
            let path = self.dir.join(segment_name(head.id));
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                warn!(segment = %path.display(), error = %e, "disk spool: cannot delete a consumed segment");
                break;
            }
            self.disk_bytes -= head.size;
            self.segments.pop_front();
            if is_writer {
                self.writer = None;
            }
        }
    }

    fn read_entry(&self, e: &Entry) -> std::io::Result<Encoded> {
        let mut f = File::open(self.dir.join(segment_name(e.segment)))?;
        f.seek(SeekFrom::Start(e.offset))?;
        let mut data = vec![0u8; (HEADER + e.len) as usize];
        f.read_exact(&mut data)?;
        let crc = u32::from_le_bytes([data[4], data[5], data[6], data[7]]);
        let body = data.split_off(HEADER as usize);
        if checksum(e.seq, &body) != crc {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "checksum mismatch",
            ));
        }
        Ok(Encoded { seq: e.seq, body })
    }

    /// Make `front` the oldest readable record, dropping unreadable ones.
    fn load_front(&mut self) {
        self.front = None;
        while let Some(e) = self.entries.front().copied() {
            match self.read_entry(&e) {
                Ok(item) => {
                    self.front = Some(item);
                    return;
                }
                Err(err) => {
                    warn!(seq = e.seq, error = %err, "disk spool: unreadable request dropped");
                    self.consume_front();
                    self.dropped += 1;
                }
            }
        }
    }

    /// Forget the oldest entry (acknowledged or dropped): record it in `ack`, free its space.
    fn consume_front(&mut self) -> Option<Entry> {
        let e = self.entries.pop_front()?;
        self.live_bytes -= HEADER + e.len;
        self.acked = Some(e.seq);
        if let Err(err) = self.write_ack(e.seq) {
            debug!(error = %err, "disk spool: cannot record the acknowledgement");
        }
        self.collect_garbage();
        Some(e)
    }

    fn write_ack(&self, seq: u64) -> std::io::Result<()> {
        let tmp = self.dir.join("ack.tmp");
        std::fs::write(&tmp, format!("{seq}\n"))?;
        std::fs::rename(&tmp, self.dir.join("ack"))
    }

    fn append(&mut self, item: &Encoded) -> std::io::Result<()> {
        let len = item.body.len() as u64;
        let need_new = match self.segments.back() {
            None => true,
            Some(s) => {
                self.writer.is_none() || s.size + HEADER + len > self.segment_max && s.size > 0
            }
        };
        if need_new {
            let id = item.seq;
            let path = self.dir.join(segment_name(id));
            let f = OpenOptions::new().create(true).append(true).open(&path)?;
            let size = f.metadata()?.len();
            self.writer = Some(f);
            if self.segments.back().is_none_or(|s| s.id != id) {
                self.segments.push_back(Segment { id, size });
                self.disk_bytes += size;
            }
        }
        let Some(segment_id) = self.segments.back().map(|s| s.id) else {
            return Err(std::io::Error::other("no segment to write to"));
        };
        let Some(writer) = self.writer.as_mut() else {
            return Err(std::io::Error::other("no segment to write to"));
        };
        let mut record = Vec::with_capacity((HEADER + len) as usize);
        let len32 = u32::try_from(len).map_err(|_| std::io::Error::other("request too large"))?;
        record.extend_from_slice(&len32.to_le_bytes());
        record.extend_from_slice(&checksum(item.seq, &item.body).to_le_bytes());
        record.extend_from_slice(&item.seq.to_le_bytes());
        record.extend_from_slice(&item.body);
        let offset = self.segments.back().map_or(0, |s| s.size);
        writer.write_all(&record)?;
        writer.sync_data()?;
        if let Some(s) = self.segments.back_mut() {
            s.size += HEADER + len;
        }
        self.disk_bytes += HEADER + len;
        self.live_bytes += HEADER + len;
        self.entries.push_back(Entry {
            seq: item.seq,
            segment: segment_id,
            offset,
            len,
        });
        Ok(())
    }
}

impl Spool for DiskSpool {
    fn push(&mut self, item: Encoded) -> Option<Encoded> {
        let need = HEADER + item.body.len() as u64;
        let mut evicted = None;
        // Drop the oldest until the new record fits under the bound.
        while self.disk_bytes + need > self.max_bytes && !self.entries.is_empty() {
            if let Some(e) = self.consume_front() {
                self.dropped += 1;
                evicted = Some(Encoded {
                    seq: e.seq,
                    body: Vec::new(),
                });
            }
            // The consumed records may share the writer's segment: start a new one so the
            // old one can go.
            if self.disk_bytes + need > self.max_bytes && self.entries.is_empty() {
                self.writer = None;
                self.collect_garbage();
            }
        }
        self.last_seq = Some(self.last_seq.map_or(item.seq, |l| l.max(item.seq)));
        if let Err(e) = self.append(&item) {
            warn!(dir = %self.dir.display(), error = %e, "disk spool: cannot write; this request is dropped");
            self.dropped += 1;
        }
        if self.front.is_none() || evicted.is_some() {
            self.load_front();
        }
        evicted
    }

    fn front(&self) -> Option<&Encoded> {
        self.front.as_ref()
    }

    fn peek(&self, max_items: usize, max_bytes: u64) -> Vec<Encoded> {
        let Some(front) = self.front.clone() else {
            return Vec::new();
        };
        let mut bytes = front.body.len() as u64;
        let mut out = vec![front];
        for e in self.entries.iter().skip(1) {
            if out.len() >= max_items || bytes + e.len > max_bytes {
                break;
            }
            // An unreadable record ends the batch; it is dropped when it reaches the front.
            let Ok(item) = self.read_entry(e) else {
                break;
            };
            bytes += e.len;
            out.push(item);
        }
        out
    }

    fn pop_front(&mut self) -> Option<Encoded> {
        let item = self.front.take()?;
        debug_assert_eq!(self.entries.front().map(|e| e.seq), Some(item.seq));
        self.consume_front();
        self.load_front();
        Some(item)
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn dropped(&self) -> u64 {
        self.dropped
    }

    fn bytes(&self) -> u64 {
        self.live_bytes
    }

    fn last_seq(&self) -> Option<u64> {
        self.last_seq
    }
}

#[cfg(test)]
mod tests;
