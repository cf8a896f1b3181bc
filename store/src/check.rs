//! `gpuwatch check` and `gpuwatch repair`: the offline view of a data directory (or an
//! `--object-store` prefix) and what can be done about its damage.
//!
//! [`check`] reads everything — every WAL segment, every entry of every table's Delta log, every
//! data file the logs name (decoded whole), the alerting state — and lists what is damaged with
//! what it holds. [`repair`] plans, for each finding, what rebuilds it and what moves to
//! `quarantine/` (never deleting anything), and with `apply` does it (`apply.rs`):
//!
//! - a table whose log has unreadable versions: the damaged entry and every later version move
//!   to quarantine (the log must be read in order); then the data files those versions added,
//!   named by no readable version, are committed again ("a log rewritten from its readable
//!   files") — persist files (`p<segment>` in their name) of any writer whose readable `txn` is
//!   older, together with that writer's `txn`, so that its WAL replay never adds their rows a
//!   second time; rows the lost versions held that are still in this data directory's WAL are
//!   committed again by the server when it replays them at its next start. Compaction and
//!   rollup outputs of the lost versions move to quarantine (their inputs are still in the
//!   table; the next maintenance builds the rollups again).
//! - a damaged checkpoint or an older damaged commit the server reads around: moves to
//!   quarantine.
//! - a damaged data file the log names: a commit removes it, then it moves to quarantine.
//! - damaged alerting state: moves to quarantine (the server does so itself at start).
//! - a damaged WAL segment: nothing; the server replays every valid record in it and moves it
//!   to quarantine once they are committed.
//!
//! Run it with the server stopped.

mod apply;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use arrow::array::RecordBatch;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::Serialize;

use crate::delta::guard::{EntryKind, Inspector, LogHealth, version_of};
use crate::delta::schema::{from_file_batch, to_file_batch};
use crate::delta::{DeltaTables, table_dir};
use crate::persist::storage::{Listed, WRITER_ID_FILE};
use crate::persist::{FileMeta, Storage};
use crate::schema::Table;
use crate::{Error, Result, quarantine, wal};

/// Where to look.
#[derive(Debug, Clone)]
pub struct CheckConfig {
    /// The data directory (WAL, writer id, alerting state; the tables too without an object
    /// store).
    pub data_dir: PathBuf,
    /// `s3://bucket/prefix` holding the tables, if not the data directory.
    pub object_store: Option<String>,
    /// Object store client settings over the environment's (`aws_endpoint`, ...).
    pub object_store_options: Vec<(String, String)>,
    /// Check only that data files are present with their size, without decoding them.
    pub quick: bool,
}

/// What a finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A WAL segment with byte ranges holding no valid record.
    WalSegment,
    /// A Delta commit.
    Commit,
    /// A Delta checkpoint.
    Checkpoint,
    /// `_delta_log/_last_checkpoint`.
    LastCheckpoint,
    /// A readable version after a damaged one (moved with it: the log is read in order).
    UnreadVersion,
    /// A data file a readable version names.
    DataFile,
    /// A data file only unreadable versions name.
    UnreadFile,
    /// Alerting state (`alerts/*.json`).
    AlertState,
    /// Something moved to quarantine earlier (listed, not damage).
    Quarantined,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::WalSegment => "wal segment",
            Kind::Commit => "commit",
            Kind::Checkpoint => "checkpoint",
            Kind::LastCheckpoint => "last checkpoint",
            Kind::UnreadVersion => "unread version",
            Kind::DataFile => "data file",
            Kind::UnreadFile => "unread file",
            Kind::AlertState => "alert state",
            Kind::Quarantined => "quarantined",
        }
    }
}

/// One thing found, what it holds, and what repair does about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// What it is.
    pub kind: Kind,
    /// Its table, if any.
    pub table: Option<String>,
    /// Where it is (a path, or `s3://…`).
    pub path: String,
    /// Its Delta version, for log entries.
    pub version: Option<u64>,
    /// The hour its rows are in (`YYYY-MM-DD HH:00`), for data files.
    pub hour: Option<String>,
    /// Rows it holds (or held), when known.
    pub rows: Option<u64>,
    /// Its size in bytes, when known.
    pub bytes: Option<u64>,
    /// Byte ranges holding no valid record, for WAL segments.
    pub ranges: Option<String>,
    /// What is wrong with it.
    pub problem: String,
    /// What `repair` does about it (or did, with `--apply`).
    pub action: String,
    /// True when it is damage (a quarantined file is listed for information only).
    pub damage: bool,
}

impl Finding {
    fn new(kind: Kind, path: String, problem: String, action: String) -> Self {
        Self {
            kind,
            table: None,
            path,
            version: None,
            hour: None,
            rows: None,
            bytes: None,
            ranges: None,
            problem,
            action,
            damage: kind != Kind::Quarantined,
        }
    }

    fn of_table(mut self, table: Table) -> Self {
        self.table = Some(table.name().to_string());
        self
    }

    /// What it holds, in words: `hour 2026-01-01 10:00, 50 rows, 4096 bytes, bytes 8..20`.
    pub fn holds(&self) -> String {
        let mut parts = Vec::new();
        if let Some(v) = self.version {
            parts.push(format!("version {v}"));
        }
        if let Some(h) = &self.hour {
            parts.push(format!("hour {h}"));
        }
        if let Some(r) = self.rows {
            parts.push(format!("{r} rows"));
        }
        if let Some(b) = self.bytes {
            parts.push(format!("{b} bytes"));
        }
        if let Some(r) = &self.ranges {
            parts.push(format!("bytes {r} unreadable"));
        }
        parts.join(", ")
    }
}

/// The state of one table's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableState {
    /// The table.
    pub table: String,
    /// The version read (`None`: none readable, or no log).
    pub read_at: Option<u64>,
    /// The newest version in the log.
    pub newest: Option<u64>,
    /// Versions not read, `[first, last]`.
    pub lost: Option<[u64; 2]>,
    /// Data files the readable version names.
    pub files: usize,
}

/// Everything found, and what repair does (or did).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// The data directory or object store prefix looked at.
    pub root: String,
    /// True when `repair --apply` made the changes listed.
    pub applied: bool,
    /// Every table's log.
    pub tables: Vec<TableState>,
    /// What was found.
    pub findings: Vec<Finding>,
}

impl Report {
    /// True when any finding is damage.
    pub fn damaged(&self) -> bool {
        self.findings.iter().any(|f| f.damage)
    }

    /// The report as a text table.
    pub fn to_table(&self) -> String {
        let mut out = format!("root: {}\n\n", self.root);
        out.push_str(&table_text(
            &["TABLE", "READ AT", "NEWEST", "NOT READ", "FILES"],
            self.tables.iter().map(|t| {
                vec![
                    t.table.clone(),
                    opt(t.read_at),
                    opt(t.newest),
                    t.lost.map_or("-".into(), |[a, b]| format!("{a}..={b}")),
                    t.files.to_string(),
                ]
            }),
        ));
        out.push('\n');
        if self.findings.is_empty() {
            out.push_str("no damage found\n");
            return out;
        }
        out.push_str(&table_text(
            &["KIND", "TABLE", "PATH", "HOLDS", "PROBLEM", "ACTION"],
            self.findings.iter().map(|f| {
                vec![
                    f.kind.word().to_string(),
                    f.table.clone().unwrap_or_else(|| "-".into()),
                    f.path.clone(),
                    f.holds(),
                    f.problem.clone(),
                    f.action.clone(),
                ]
            }),
        ));
        let damage = self.findings.iter().filter(|f| f.damage).count();
        out.push_str(&format!(
            "\n{damage} damaged item(s){}\n",
            if self.applied {
                ": repaired as listed"
            } else {
                ""
            }
        ));
        out
    }
}

fn opt(v: Option<u64>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

fn table_text(head: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let rows: Vec<Vec<String>> = rows.collect();
    let mut widths: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut l = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                l.push_str(&format!("{c:<w$}  "));
            }
        }
        l.trim_end().to_string() + "\n"
    };
    let mut out = line(head.iter().map(|h| h.to_string()).collect());
    for r in rows {
        out.push_str(&line(r));
    }
    out
}

/// Checks everything; changes nothing.
pub fn check(config: &CheckConfig) -> Result<Report> {
    let ctx = Ctx::open(config)?;
    Ok(ctx.plan()?.report(&ctx, false))
}

/// Plans the repair of what [`check`] finds; with `apply`, carries it out.
pub fn repair(config: &CheckConfig, apply: bool) -> Result<Report> {
    let ctx = Ctx::open(config)?;
    let plan = ctx.plan()?;
    if apply {
        apply::run(&ctx, &plan)?;
    }
    Ok(plan.report(&ctx, apply))
}

/// The storage and data directory looked at.
pub(crate) struct Ctx {
    storage: Storage,
    data_dir: PathBuf,
    quick: bool,
    now_millis: i64,
}

impl Ctx {
    fn open(config: &CheckConfig) -> Result<Self> {
        let dir = &config.data_dir;
        if !dir.is_dir() && config.object_store.is_none() {
            return Err(Error::io(
                dir,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no data directory here: give the server's --data-dir",
                ),
            ));
        }
        // The writer id is read, never made: check changes nothing.
        let has_id = dir.join(WRITER_ID_FILE).exists();
        let storage = match &config.object_store {
            Some(url) => Storage::object_store(url, &config.object_store_options, dir, has_id)?,
            None => Storage::local(dir, has_id)?,
        };
        let now_millis = chrono::Utc::now().timestamp_millis();
        Ok(Self {
            storage,
            data_dir: dir.clone(),
            quick: config.quick,
            now_millis,
        })
    }

    fn plan(&self) -> Result<Plan> {
        let mut plan = Plan::default();
        self.plan_wal(&mut plan)?;
        self.plan_alert_state(&mut plan)?;
        let tables = DeltaTables::open(&self.storage, false)?;
        for table in Table::ALL {
            self.plan_table(&tables, table, &mut plan)?;
        }
        for (path, note) in quarantine::list(&self.storage, &self.data_dir)? {
            plan.findings.push(Finding::new(
                Kind::Quarantined,
                path,
                note.reason,
                format!("kept (moved {})", note.moved_at),
            ));
        }
        Ok(plan)
    }

    fn plan_wal(&self, plan: &mut Plan) -> Result<()> {
        for (_, path) in wal::list_segments(&self.data_dir.join("wal"))? {
            let mut rows = 0u64;
            let report = wal::read_segment(&path, |payload| {
                if let Ok(w) = wal::decode_payload(payload) {
                    rows += w.rows() as u64;
                }
                Ok(())
            })?;
            if !report.damaged() {
                continue;
            }
            let mut f = Finding::new(
                Kind::WalSegment,
                path.display().to_string(),
                format!(
                    "{} bytes hold no valid record ({} valid records kept)",
                    report.skipped_bytes(),
                    report.records
                ),
                "none: the server replays every valid record and moves the segment to quarantine once they are committed".into(),
            );
            f.rows = Some(rows);
            f.bytes = Some(report.bytes);
            f.ranges = Some(report.ranges_text());
            plan.findings.push(f);
        }
        Ok(())
    }

    fn plan_alert_state(&self, plan: &mut Plan) -> Result<()> {
        for name in ["state.json", "silences.json", "notify.json"] {
            let rel = format!("alerts/{name}");
            let path = self.data_dir.join(&rel);
            let bytes = match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(&path, e)),
            };
            if let Err(e) = serde_json::from_slice::<serde_json::Value>(&bytes) {
                plan.findings.push(Finding::new(
                    Kind::AlertState,
                    path.display().to_string(),
                    format!("is not valid JSON ({e})"),
                    "move to quarantine (the server also does so at start, then alerting starts from an empty state)".into(),
                ));
                plan.alert_state.push((rel, e.to_string()));
            }
        }
        Ok(())
    }

    fn plan_table(&self, tables: &DeltaTables, table: Table, plan: &mut Plan) -> Result<()> {
        let inspection = Inspector::default().inspect(&self.storage, table, true)?;
        let health = inspection.health;
        let active: Vec<FileMeta> = tables.files(table).as_ref().clone();
        plan.tables.push(TableState {
            table: table.name().into(),
            read_at: health.read_at,
            newest: health.newest,
            lost: health.lost().map(|(a, b)| [a, b]),
            files: active.len(),
        });
        let mut tp = TablePlan {
            table,
            recreate: health.read_at.is_none() && health.newest.is_some(),
            log_moves: Vec::new(),
            readd: Vec::new(),
            remove: Vec::new(),
            set_aside: Vec::new(),
        };
        self.plan_log(table, &health, &mut tp, plan)?;
        if health.blocks() {
            self.plan_unread_files(tables, table, &active, &mut tp, plan)?;
        }
        self.plan_data_files(table, &active, &mut tp, plan)?;
        if !tp.is_empty() {
            plan.table_plans.push(tp);
        }
        Ok(())
    }

    /// The log entries to move: the damaged ones, and every version at or after the first
    /// version not read.
    fn plan_log(
        &self,
        table: Table,
        health: &LogHealth,
        tp: &mut TablePlan,
        plan: &mut Plan,
    ) -> Result<()> {
        let first_lost = health.lost().map(|(a, _)| a);
        let mut moved = HashSet::new();
        for bad in &health.bad {
            let kind = match bad.kind {
                EntryKind::Commit => Kind::Commit,
                EntryKind::Checkpoint => Kind::Checkpoint,
                EntryKind::LastCheckpoint => Kind::LastCheckpoint,
            };
            let exists = !bad.problem.starts_with("is missing");
            let action = if exists {
                "move to quarantine".to_string()
            } else {
                "none (nothing to move)".to_string()
            };
            let mut f = Finding::new(
                kind,
                self.storage.location(&bad.path),
                bad.problem.clone(),
                action,
            )
            .of_table(table);
            f.version = bad.version;
            plan.findings.push(f);
            if exists && moved.insert(bad.path.clone()) {
                tp.log_moves.push((bad.path.clone(), bad.problem.clone()));
            }
        }
        let Some(first) = first_lost else {
            return Ok(());
        };
        let log = format!("{}/_delta_log", table_dir(table));
        for l in self.storage.list(&log)? {
            let name = l.rel.rsplit('/').next().unwrap_or(&l.rel);
            let later = version_of(name).is_some_and(|v| v >= first);
            if later && moved.insert(l.rel.clone()) {
                let mut f = Finding::new(
                    Kind::UnreadVersion,
                    self.storage.location(&l.rel),
                    format!("comes after version {first}, which is not readable"),
                    "move to quarantine (the log is read in order; its data files are handled below)".into(),
                )
                .of_table(table);
                f.version = version_of(name);
                plan.findings.push(f);
                tp.log_moves
                    .push((l.rel.clone(), format!("after unreadable version {first}")));
            }
        }
        Ok(())
    }
}

/// What repair does to one table.
#[derive(Debug)]
pub(crate) struct TablePlan {
    table: Table,
    /// No version is readable: the table is created again with the files re-added.
    recreate: bool,
    /// Log entries to move to quarantine (relative path, why).
    log_moves: Vec<(String, String)>,
    /// Files to commit again, with their writer and WAL segment.
    readd: Vec<Readd>,
    /// Damaged files the readable log names: removed by a commit, then moved.
    remove: Vec<FileMeta>,
    /// Files moved to quarantine without a commit (relative path, why).
    set_aside: Vec<(String, String)>,
}

impl TablePlan {
    fn is_empty(&self) -> bool {
        self.log_moves.is_empty()
            && self.readd.is_empty()
            && self.remove.is_empty()
            && self.set_aside.is_empty()
    }
}

/// A data file to commit again.
#[derive(Debug)]
pub(crate) struct Readd {
    writer: String,
    segment: u64,
    add: deltalake_core::kernel::Add,
}

/// Everything repair does.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    findings: Vec<Finding>,
    tables: Vec<TableState>,
    table_plans: Vec<TablePlan>,
    /// Alerting state files to move (relative path, why).
    alert_state: Vec<(String, String)>,
}

impl Plan {
    fn report(self, ctx: &Ctx, applied: bool) -> Report {
        Report {
            root: ctx.storage.describe(),
            applied,
            tables: self.tables,
            findings: self.findings,
        }
    }
}

/// What a data file's name says: `h<HH>-p<segment:020>-<writer>.parquet` for a persist.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Written {
    Persist { segment: u64, writer: String },
    Compaction,
    Other,
}

fn written_by(rel: &str) -> Written {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    let Some(stem) = name.strip_suffix(".parquet") else {
        return Written::Other;
    };
    let mut parts = stem.splitn(3, '-');
    let (_, kind, writer) = (parts.next(), parts.next(), parts.next());
    match (kind, writer) {
        (Some(k), Some(w)) if k.starts_with('p') => match k[1..].parse() {
            Ok(segment) => Written::Persist {
                segment,
                writer: w.to_string(),
            },
            Err(_) => Written::Other,
        },
        (Some(k), Some(_)) if k.starts_with('c') => Written::Compaction,
        _ => Written::Other,
    }
}

/// `YYYY-MM-DD HH:00` from `…/date=YYYY-MM-DD/hHH-….parquet`.
fn hour_of(rel: &str) -> Option<String> {
    let date = rel.split('/').find_map(|p| p.strip_prefix("date="))?;
    let name = rel.rsplit('/').next()?;
    let hh = name.strip_prefix('h')?.get(..2)?;
    Some(format!("{date} {hh}:00"))
}

/// Reads a data file whole: its rows in the file schema, or what is wrong with it.
fn read_whole(storage: &Storage, table: Table, rel: &str) -> Result<Result<RecordBatch, String>> {
    let bytes = match storage.read(rel) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(Err("is missing".into())),
        Err(e) => return Err(e),
    };
    if bytes.is_empty() {
        return Ok(Err("is empty (0 bytes)".into()));
    }
    let reader = match ParquetRecordBatchReaderBuilder::try_new(bytes).and_then(|b| b.build()) {
        Ok(r) => r,
        Err(e) => return Ok(Err(format!("is not a readable Parquet file ({e})"))),
    };
    let mut batches = Vec::new();
    for b in reader {
        let b = match b {
            Ok(b) => b,
            Err(e) => return Ok(Err(format!("cannot be decoded ({e})"))),
        };
        match from_file_batch(table, &b).and_then(|t| to_file_batch(table, &t)) {
            Ok(f) => batches.push(f),
            Err(e) => return Ok(Err(format!("does not hold the table's columns ({e})"))),
        }
    }
    let schema = crate::delta::schema::file_schema(table);
    Ok(arrow::compute::concat_batches(&schema, &batches).map_err(|e| e.to_string()))
}

impl Ctx {
    /// Files only unreadable versions name: committed again, or moved to quarantine.
    fn plan_unread_files(
        &self,
        tables: &DeltaTables,
        table: Table,
        active: &[FileMeta],
        tp: &mut TablePlan,
        plan: &mut Plan,
    ) -> Result<()> {
        let named: HashSet<String> = active.iter().map(|f| f.path.clone()).collect();
        let dir = table_dir(table);
        let removed: HashSet<String> = tables
            .tombstones(table)?
            .into_iter()
            .map(|p| format!("{dir}/{p}"))
            .collect();
        let mut covered: BTreeMap<String, u64> = BTreeMap::new();
        for l in self.data_files(table)? {
            if named.contains(&l.rel) || removed.contains(&l.rel) {
                continue;
            }
            let (finding, fate) = self.unread_file(tables, table, &l, &mut covered)?;
            plan.findings.push(finding);
            match fate {
                Fate::Readd(r) => tp.readd.push(r),
                Fate::SetAside(why) => tp.set_aside.push((l.rel.clone(), why)),
            }
        }
        Ok(())
    }

    /// The Parquet files in a table's directory.
    fn data_files(&self, table: Table) -> Result<Vec<Listed>> {
        let dir = table_dir(table);
        Ok(self
            .storage
            .list(&dir)?
            .into_iter()
            .filter(|l| {
                let name = l.rel.rsplit('/').next().unwrap_or(&l.rel);
                !l.rel.contains("/_delta_log/")
                    && name.ends_with(".parquet")
                    && !name.starts_with('.')
            })
            .collect())
    }

    fn unread_file(
        &self,
        tables: &DeltaTables,
        table: Table,
        l: &Listed,
        covered: &mut BTreeMap<String, u64>,
    ) -> Result<(Finding, Fate)> {
        let mut f = Finding::new(
            Kind::UnreadFile,
            self.storage.location(&l.rel),
            "named by no readable version".into(),
            String::new(),
        )
        .of_table(table);
        f.hour = hour_of(&l.rel);
        f.bytes = Some(l.size);
        let batch = match read_whole(&self.storage, table, &l.rel)? {
            Ok(b) => b,
            Err(problem) => {
                f.problem = format!("named by no readable version, and it {problem}");
                f.action = "move to quarantine".into();
                return Ok((f, Fate::SetAside(problem)));
            }
        };
        f.rows = Some(batch.num_rows() as u64);
        let Written::Persist { segment, writer } = written_by(&l.rel) else {
            let why = "a compaction, rollup or import output: its rows are in files still in the table (rollups are built again by the next maintenance)";
            f.action = format!("move to quarantine: {why}");
            return Ok((f, Fate::SetAside(why.into())));
        };
        let have = match covered.get(&writer) {
            Some(v) => *v,
            None => {
                let v = tables.txn_version(table, &writer)?;
                covered.insert(writer.clone(), v);
                v
            }
        };
        if segment <= have {
            let why = format!(
                "a leftover of writer {writer}: its WAL segment {segment} is covered by a readable commit"
            );
            f.action = format!("move to quarantine: {why}");
            return Ok((f, Fate::SetAside(why)));
        }
        let path_in_table = l
            .rel
            .strip_prefix(&format!("{}/", table_dir(table)))
            .unwrap_or(&l.rel)
            .to_string();
        let date = path_in_table
            .split('/')
            .find_map(|p| p.strip_prefix("date="))
            .unwrap_or_default()
            .to_string();
        let add = crate::delta::files::add(
            path_in_table,
            &date,
            l.size,
            crate::delta::files::stats(&batch),
            0,
            self.now_millis,
        );
        f.action = format!(
            "commit again, with the txn of writer {writer} at WAL segment {segment} (its WAL replay never adds these rows twice)"
        );
        Ok((
            f,
            Fate::Readd(Readd {
                writer,
                segment,
                add,
            }),
        ))
    }

    /// The data files the readable log names: each read whole (or only looked for, `quick`).
    fn plan_data_files(
        &self,
        table: Table,
        active: &[FileMeta],
        tp: &mut TablePlan,
        plan: &mut Plan,
    ) -> Result<()> {
        let damaged: Vec<(FileMeta, String)> = if self.quick {
            crate::store::check_presence(&self.storage, active)?
                .into_iter()
                .filter_map(|d| {
                    let meta = active.iter().find(|m| m.path == d.path)?.clone();
                    Some((meta, d.problem))
                })
                .collect()
        } else {
            let mut out = Vec::new();
            for meta in active {
                if let Some(p) = crate::store::verify_file(&self.storage, table, meta)? {
                    out.push((meta.clone(), p));
                }
            }
            out
        };
        for (meta, problem) in damaged {
            let mut f = Finding::new(
                Kind::DataFile,
                self.storage.location(&meta.path),
                problem,
                format!(
                    "remove from the table's log and move to quarantine: its {} rows are lost",
                    meta.rows
                ),
            )
            .of_table(table);
            f.hour = hour_of(&meta.path);
            f.rows = Some(meta.rows);
            f.bytes = Some(meta.bytes);
            plan.findings.push(f);
            tp.remove.push(meta);
        }
        Ok(())
    }
}

/// What becomes of a file only unreadable versions name.
enum Fate {
    Readd(Readd),
    SetAside(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_tell_who_wrote_them() {
        assert_eq!(
            written_by(
                "tables/gpu_metrics/date=2026-01-01/h10-p00000000000000000007-0011223344556677.parquet"
            ),
            Written::Persist {
                segment: 7,
                writer: "0011223344556677".into()
            }
        );
        assert_eq!(
            written_by(
                "tables/gpu_metrics/date=2026-01-01/h10-cabcdef0123456789-0011223344556677.parquet"
            ),
            Written::Compaction
        );
        assert_eq!(written_by("x/h10-import-0011.parquet"), Written::Other);
        assert_eq!(
            hour_of("tables/t/date=2026-01-01/h10-p1-w.parquet").as_deref(),
            Some("2026-01-01 10:00")
        );
    }
}
