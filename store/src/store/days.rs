//! Daily rollups: `gpu_metrics_1d` built by maintenance from `gpu_metrics_1h`, a closed UTC day
//! at a time ([`Table::daily`]), so that a year-long panel reads 365 rows a GPU, not 8,760.
//!
//! A day is rolled once all its hourly files lie within it and it ended an hour ago (the
//! compactor builds the last hour's rollups ten minutes after it closes). The daily file's name
//! ends with a digest of the hourly files it was built from; when those change (a late hour's
//! rollups rebuilt, the day's files merged) the digest no longer matches and the day is rolled
//! again at the next pass. Days are rolled newest first, at most [`DAYS_PER_PASS`] a pass, so
//! the first start on a long history fills the daily table over a few passes while every other
//! maintenance goes on. A day that begins before the hourly table's retention cut-off is left
//! as it is (its hours may be partly gone).

use super::Store;
use super::replace::DAY_NANOS;
use crate::compact::{self, MaintenanceReport, rollup};
use crate::persist::FileMeta;
use crate::schema::Table;
use crate::{Error, Result};

/// The most days rolled in one maintenance pass.
pub(super) const DAYS_PER_PASS: usize = 8;

/// The digest of a day's hourly files, as it ends the daily file's name: FNV-1a of the sorted
/// paths, stable across releases.
fn digest(files: &[FileMeta]) -> String {
    let mut paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    paths.sort_unstable();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in paths {
        for b in p.bytes().chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("-s{h:016x}")
}

impl Store {
    /// Rolls the closed days of each hourly rollup with a daily one whose daily file is missing
    /// or was built from other hourly files.
    pub(super) fn roll_days(&self, now: i64, report: &mut MaintenanceReport) -> Result<()> {
        for source in Table::ALL {
            let Some(table) = source.daily() else {
                continue;
            };
            let cutoff = self
                .config
                .retention
                .keep_nanos(source)
                .map_or(i64::MIN, |keep| now.saturating_sub(keep));
            let built = self.readable_files(table);
            let mut rolled = 0;
            for (day, files) in self.closed_days(source, now).into_iter().rev() {
                if rolled == DAYS_PER_PASS || day.saturating_mul(DAY_NANOS) < cutoff {
                    break;
                }
                let tag = digest(&files);
                let start = day.saturating_mul(DAY_NANOS);
                let current = built.iter().any(|f| {
                    f.min_time >= start && f.min_time < start + DAY_NANOS && f.path.contains(&tag)
                });
                if current {
                    continue;
                }
                match self.roll_day(table, day, &files, &tag) {
                    Ok(()) => {
                        rolled += 1;
                        report.rollup_files += 1;
                    }
                    Err(e @ (Error::DeltaConflict { .. } | Error::Fenced(_))) => return Err(e),
                    Err(e) => {
                        tracing::warn!(table = table.name(), day, error = %e,
                            "daily rollup of the day failed; it is retried at the next pass");
                        report.windows_skipped += 1;
                    }
                }
            }
        }
        Ok(())
    }

    fn roll_day(&self, table: Table, day: i64, files: &[FileMeta], tag: &str) -> Result<()> {
        let source = table.summarises().unwrap_or(table);
        let hourly = compact::read_files(&self.storage, source, files)?;
        let daily = rollup::rollup_rollups(&hourly, table)?;
        let hours = day.saturating_mul(24)..day.saturating_mul(24).saturating_add(24);
        self.replace_spans(table, &[(hours, &daily)], tag)
    }
}
