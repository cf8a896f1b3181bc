//! Reading a segment back: every record whose framing and checksums are valid, wherever it is.
//!
//! A record is checked on its own: its header by the header checksum (format 2), its payload by
//! the payload checksum. When a frame is not valid (a flipped bit, a zero-filled hole, garbage,
//! a torn tail) the reader scans forward byte by byte for the next valid frame and goes on from
//! there, so one damaged record costs only itself. The skipped byte ranges are reported.
//!
//! The scan is cheap: a candidate position costs one checksum of 8 bytes (format 2). Segments of
//! format 1 (earlier releases, no header checksum) are scanned too; there a candidate must also
//! look like the start of a write (`record.rs`: a table count and a table id) before its payload
//! checksum is computed.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::{FRAME_HEADER_V1, FRAME_HEADER_V2, MAGIC, MAGIC_V1, MAX_RECORD_BYTES};
use crate::{Error, Result};

/// What reading one segment found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SegmentReport {
    /// Valid records read.
    pub records: u64,
    /// Byte ranges that held no valid record (damaged records, holes, garbage, a torn tail), in
    /// order. Empty for an intact segment.
    pub skipped: Vec<Range<u64>>,
    /// The segment's size.
    pub bytes: u64,
    /// The segment's format (1: earlier releases; 2: with a header checksum).
    pub format: u8,
}

impl SegmentReport {
    /// Bytes that held no valid record.
    pub fn skipped_bytes(&self) -> u64 {
        self.skipped.iter().map(|r| r.end - r.start).sum()
    }

    /// True when any byte was skipped.
    pub fn damaged(&self) -> bool {
        !self.skipped.is_empty()
    }

    /// The skipped ranges as text: `8..20, 4096..8192`.
    pub fn ranges_text(&self) -> String {
        self.skipped
            .iter()
            .map(|r| format!("{}..{}", r.start, r.end))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn skip(&mut self, range: Range<u64>) {
        if range.is_empty() {
            return;
        }
        match self.skipped.last_mut() {
            Some(last) if last.end == range.start => last.end = range.end,
            _ => self.skipped.push(range),
        }
    }
}

/// The framing of one segment format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    V1,
    V2,
}

impl Format {
    fn header(self) -> u64 {
        match self {
            Format::V1 => FRAME_HEADER_V1 as u64,
            Format::V2 => FRAME_HEADER_V2 as u64,
        }
    }

    fn number(self) -> u8 {
        match self {
            Format::V1 => 1,
            Format::V2 => 2,
        }
    }

    /// The payload length and checksum a header at the start of `h` claims, if its framing is
    /// valid for a segment of `total` bytes at `offset`.
    fn claim(self, h: &[u8], offset: u64, total: u64) -> Option<(u32, u32)> {
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        // No record is empty: a zero length is a zero-filled region (a hole), not a record.
        if len == 0 || len > MAX_RECORD_BYTES || offset + self.header() + u64::from(len) > total {
            return None;
        }
        if self == Format::V2 {
            let hcrc = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
            if crc32fast::hash(&h[..8]) != hcrc {
                return None;
            }
        }
        Some((len, crc))
    }
}

/// A segment file read at known positions.
struct Segment<'a> {
    path: &'a Path,
    file: File,
    total: u64,
}

impl Segment<'_> {
    /// Reads `buf.len()` bytes at `offset` (the caller checked they are within the file).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| Error::io(self.path, e))
    }

    /// The payload of a valid frame at `offset`, read into `payload`; false when the frame there
    /// is not valid.
    fn frame_at(
        &self,
        format: Format,
        offset: u64,
        header: &mut [u8; FRAME_HEADER_V2],
        payload: &mut Vec<u8>,
    ) -> Result<bool> {
        let h = format.header();
        if offset + h > self.total {
            return Ok(false);
        }
        let header = &mut header[..h as usize];
        self.read_at(header, offset)?;
        let Some((len, crc)) = format.claim(header, offset, self.total) else {
            return Ok(false);
        };
        self.payload_matches(offset + h, len, crc, payload)
    }

    fn payload_matches(&self, at: u64, len: u32, crc: u32, payload: &mut Vec<u8>) -> Result<bool> {
        payload.resize(len as usize, 0);
        self.read_at(payload, at)?;
        Ok(crc32fast::hash(payload) == crc)
    }

    /// The offset of the next valid frame after `from` (exclusive), or the end of the file. The
    /// file is scanned in windows, each candidate header checked in memory first.
    fn resync(&self, format: Format, from: u64, payload: &mut Vec<u8>) -> Result<u64> {
        const WINDOW: u64 = 1 << 20;
        let h = format.header();
        // V1 candidates are also checked against the first bytes of their payload.
        let look = h + if format == Format::V1 { 7 } else { 0 };
        let mut window = Vec::new();
        let mut start = from + 1;
        while start + h <= self.total {
            let end = (start + WINDOW + look).min(self.total);
            window.resize((end - start) as usize, 0);
            self.read_at(&mut window, start)?;
            let last = (end - start).saturating_sub(h);
            for i in 0..=last {
                let at = start + i;
                let i = i as usize;
                let Some((len, crc)) = format.claim(&window[i..], at, self.total) else {
                    continue;
                };
                if format == Format::V1
                    && let Some(head) = window.get(i + h as usize..i + look as usize)
                    && !super::record::plausible_start(head, len)
                {
                    continue;
                }
                if self.payload_matches(at + h, len, crc, payload)? {
                    return Ok(at);
                }
            }
            start += WINDOW;
        }
        Ok(self.total)
    }
}

/// Reads every valid record of a segment, in order, handing each payload to `f`; damaged
/// stretches are skipped and reported. Memory use is bounded by the largest record and a 1 MiB
/// scan window, not the segment.
pub fn read_segment(path: &Path, mut f: impl FnMut(&[u8]) -> Result<()>) -> Result<SegmentReport> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let total = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let seg = Segment { path, file, total };
    let mut report = SegmentReport {
        bytes: total,
        ..SegmentReport::default()
    };
    let mut magic = [0u8; 8];
    if total < magic.len() as u64 {
        report.skip(0..total);
        return Ok(report);
    }
    seg.read_at(&mut magic, 0)?;
    let format = if &magic == MAGIC {
        Format::V2
    } else if &magic == MAGIC_V1 {
        Format::V1
    } else {
        // A damaged magic: read the body as the current format, then as the earlier one.
        report.skip(0..magic.len() as u64);
        let v2 = scan(&seg, Format::V2, report.clone(), &mut |_: &[u8]| Ok(()))?;
        let format = if v2.records > 0 || scan_count(&seg, Format::V1)? == 0 {
            Format::V2
        } else {
            Format::V1
        };
        report.format = format.number();
        return scan(&seg, format, report, &mut f);
    };
    report.format = format.number();
    scan(&seg, format, report, &mut f)
}

fn scan_count(seg: &Segment<'_>, format: Format) -> Result<u64> {
    Ok(scan(
        seg,
        format,
        SegmentReport::default(),
        &mut |_: &[u8]| Ok(()),
    )?
    .records)
}

fn scan(
    seg: &Segment<'_>,
    format: Format,
    mut report: SegmentReport,
    f: &mut impl FnMut(&[u8]) -> Result<()>,
) -> Result<SegmentReport> {
    let mut offset = MAGIC.len() as u64;
    let mut header = [0u8; FRAME_HEADER_V2];
    let mut payload = Vec::new();
    while offset < seg.total {
        if seg.frame_at(format, offset, &mut header, &mut payload)? {
            f(&payload)?;
            report.records += 1;
            offset += format.header() + payload.len() as u64;
            continue;
        }
        let next = seg.resync(format, offset, &mut payload)?;
        report.skip(offset..next);
        offset = next;
    }
    Ok(report)
}
