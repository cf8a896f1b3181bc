//! The `job_ledger` table's schema. Its rows (the `jobs` view's sums per job, GPU and closed
//! hour, docs/cost.md) are computed by the cost accounting above the store, which declares the
//! columns once, before the store opens ([`declare_job_ledger`]); the store needs only `time`
//! first and the columns it sorts files by. Until they are declared the table has those alone
//! (a store opened by a process that never writes the ledger).

use std::sync::{Arc, LazyLock, OnceLock};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use super::time_type;

/// The columns the store itself relies on, in this order at the start of the schema.
pub const JOB_LEDGER_KEY: [&str; 4] = ["time", "job_id", "host", "gpu_uuid"];

static DECLARED: OnceLock<SchemaRef> = OnceLock::new();

/// The key columns alone: the schema of a process that never declares the full one.
static KEY_ONLY: LazyLock<SchemaRef> = LazyLock::new(|| Arc::new(Schema::new(key_fields())));

fn key_fields() -> Vec<Field> {
    let mut fields = vec![Field::new("time", time_type(), false)];
    fields.extend(
        JOB_LEDGER_KEY[1..]
            .iter()
            .map(|c| Field::new(*c, DataType::Utf8, true)),
    );
    fields
}

/// The schema of `job_ledger`: the declared one, else the key columns.
pub(super) fn job_ledger_schema() -> SchemaRef {
    Arc::clone(DECLARED.get().unwrap_or(&KEY_ONLY))
}

/// Declares the columns of `job_ledger`: [`JOB_LEDGER_KEY`] (with these types), then `extra`.
/// Runs before the store opens (which creates the table, or adds the columns a newer release
/// declares); declaring the same columns again is fine, different ones are an error.
pub fn declare_job_ledger(extra: Vec<Field>) -> Result<(), String> {
    let mut fields = key_fields();
    fields.extend(extra);
    let wanted = Arc::new(Schema::new(fields));
    let names: std::collections::HashSet<&String> =
        wanted.fields().iter().map(|f| f.name()).collect();
    if names.len() != wanted.fields().len() {
        return Err("the job_ledger columns repeat a name".into());
    }
    let got = DECLARED.get_or_init(|| Arc::clone(&wanted));
    if got == &wanted {
        Ok(())
    } else {
        Err(format!(
            "the job_ledger table's columns were declared twice, differently ({} and {} columns)",
            got.fields().len(),
            wanted.fields().len()
        ))
    }
}
