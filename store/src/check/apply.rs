//! `gpuwatch repair --apply`: carries out a [`Plan`]. Every file it takes out of the way moves
//! to `quarantine/` with a note; nothing is deleted. Per table: the damaged log entries and the
//! versions after them move first, then one commit (or, when no version is readable, the
//! table's first commit) re-adds the files only those versions named and removes the damaged
//! files the log names; then those damaged files and the files not re-added move.

use std::collections::BTreeMap;

use deltalake_core::kernel::{Action, Transaction};

use super::{Ctx, Plan, TablePlan};
use crate::Result;
use crate::delta::{DeltaTables, files};
use crate::quarantine::{self, Note};

/// Carries out `plan`.
pub(super) fn run(ctx: &Ctx, plan: &Plan) -> Result<()> {
    for (rel, why) in &plan.alert_state {
        let note = Note::new(
            rel,
            ctx.now_millis,
            format!("unreadable alerting state ({why}): moved by gpuwatch repair"),
            serde_json::json!({}),
        );
        let to = quarantine::move_local(&ctx.data_dir, rel, &note, ctx.now_millis)?;
        tracing::info!(file = %rel, quarantined = %to.display(), "alerting state moved to quarantine");
    }
    for tp in &plan.table_plans {
        table(ctx, tp)?;
    }
    Ok(())
}

fn set_aside(ctx: &Ctx, rel: &str, why: &str, details: serde_json::Value) -> Result<()> {
    let note = Note::new(rel, ctx.now_millis, why, details);
    let to = quarantine::move_stored(&ctx.storage, rel, &note, ctx.now_millis)?;
    tracing::info!(file = %rel, quarantined = %to, "moved to quarantine");
    Ok(())
}

fn table(ctx: &Ctx, tp: &TablePlan) -> Result<()> {
    let name = tp.table.name();
    for (rel, why) in &tp.log_moves {
        set_aside(
            ctx,
            rel,
            &format!("delta log entry of table {name}: {why}"),
            serde_json::json!({"table": name}),
        )?;
    }
    let mut actions: Vec<Action> = tp
        .readd
        .iter()
        .map(|r| Action::Add(r.add.clone()))
        .collect();
    for meta in &tp.remove {
        actions.push(Action::Remove(files::remove(
            meta.path_in_table(),
            meta.bytes,
            meta.date(),
            true,
            ctx.now_millis,
        )));
    }
    let mut coverage: BTreeMap<&str, u64> = BTreeMap::new();
    for r in &tp.readd {
        let c = coverage.entry(r.writer.as_str()).or_default();
        *c = (*c).max(r.segment);
    }
    actions.extend(coverage.iter().map(|(writer, segment)| {
        Action::Txn(Transaction::new_with_last_update(
            *writer,
            i64::try_from(*segment).unwrap_or(i64::MAX),
            Some(ctx.now_millis),
        ))
    }));
    if !tp.readd.is_empty() || !tp.remove.is_empty() {
        if tp.recreate {
            DeltaTables::create_with(&ctx.storage, tp.table, actions, None)?;
        } else {
            let mut tables = DeltaTables::open(&ctx.storage, false)?;
            tables.commit_repair(tp.table, actions)?;
        }
        tracing::info!(
            table = name,
            readded = tp.readd.len(),
            removed = tp.remove.len(),
            "repair committed"
        );
    }
    for meta in &tp.remove {
        set_aside(
            ctx,
            &meta.path,
            &format!("damaged data file of table {name}, removed from its log by gpuwatch repair"),
            serde_json::json!({"table": name, "rows": meta.rows, "bytes": meta.bytes}),
        )?;
    }
    for (rel, why) in &tp.set_aside {
        set_aside(
            ctx,
            rel,
            &format!("data file of table {name} named only by unreadable versions: {why}"),
            serde_json::json!({"table": name}),
        )?;
    }
    Ok(())
}
