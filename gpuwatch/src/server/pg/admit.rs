//! The read-only gate as the Postgres front end applies it, and what it does with each statement.

use datafusion::sql::sqlparser::ast::{Set, Statement as Sql};
use datafusion_postgres::datafusion_pg_catalog::sql::PostgresCompatibilityParser;
use datafusion_postgres::pgwire::error::PgWireResult;

use super::errors::{engine_error, error};
use gpuwatch_query::gate;
use gpuwatch_query::{Error, lower_first};

/// Session variables `datafusion-postgres` keeps per connection; every other `SET` is accepted
/// and ignored, except DataFusion's own settings, which would change the shared session.
pub(super) const SESSION_SETTINGS: &[&str] = &[
    "statement_timeout",
    "datestyle",
    "bytea_output",
    "intervalstyle",
    "application_name",
    "extra_float_digits",
    "search_path",
];

/// What the front end does with a statement.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// A query: runs under a slot and the time limit.
    Query,
    /// A session statement handled without touching the data (SET, BEGIN, SHOW).
    Session,
    /// `FETCH`: reads on under the slot its cursor holds, not bound by the time limit.
    Fetch,
    /// A `SET` of something the session does not keep: answered `SET`, changes nothing.
    IgnoredSet,
    /// `DECLARE name CURSOR FOR <gated query>`: the cursor holds a slot until it is closed
    /// ([`CursorSlots`]).
    Declare(String),
    /// `CLOSE name` or `CLOSE ALL`: frees the slots of the cursors it closes.
    Close,
}

/// The read-only gate, as the Postgres front end applies it.
pub(super) fn admit(statement: &Sql) -> Result<Verdict, Error> {
    match statement {
        Sql::Set(set) => match set {
            Set::SetTimeZone { .. } => Ok(Verdict::IgnoredSet),
            Set::SingleAssignment { variable, .. } => {
                let name = variable.to_string().to_ascii_lowercase();
                if name.starts_with("datafusion.") {
                    Err(Error::NotAllowed(format!(
                        "statement SET {name} is not allowed: DataFusion settings are fixed by the server"
                    )))
                } else if SESSION_SETTINGS.contains(&name.as_str()) {
                    Ok(Verdict::Session)
                } else {
                    Ok(Verdict::IgnoredSet)
                }
            }
            _ => Ok(Verdict::IgnoredSet),
        },
        Sql::StartTransaction { .. } | Sql::Commit { .. } | Sql::Rollback { .. } => {
            Ok(Verdict::Session)
        }
        Sql::ShowVariable { .. } => Ok(Verdict::Session),
        Sql::Declare { stmts } => {
            for d in stmts {
                if let Some(q) = &d.for_query {
                    gate::check_parsed(&Sql::Query(q.clone()))?;
                }
            }
            // `datafusion-postgres` names the cursor after the first name of each DECLARE; the
            // Postgres grammar has one DECLARE with one name per statement.
            match stmts.as_slice() {
                [one] => Ok(Verdict::Declare(
                    one.names
                        .first()
                        .map(|n| n.value.clone())
                        .unwrap_or_default(),
                )),
                _ => Err(Error::BadSql(
                    "declare one cursor per DECLARE statement".to_string(),
                )),
            }
        }
        Sql::Fetch { .. } => Ok(Verdict::Fetch),
        Sql::Close { .. } => Ok(Verdict::Close),
        other => {
            gate::check_parsed(other)?;
            Ok(Verdict::Query)
        }
    }
}

/// Parses `sql` as the executing parser will, and runs every statement through the gate.
pub(super) fn admit_all(
    parser: &PostgresCompatibilityParser,
    sql: &str,
) -> PgWireResult<Vec<Verdict>> {
    gate::check_length(sql).map_err(|e| engine_error(&e))?;
    let statements = parser
        .parse(sql)
        .map_err(|e| error("ERROR", "42601", lower_first(&e.to_string())))?;
    statements
        .iter()
        .map(|s| admit(s).map_err(|e| engine_error(&e)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(sql: &str) -> Result<Verdict, Error> {
        let parser = PostgresCompatibilityParser::new();
        let statements = parser.parse(sql).expect("parses");
        assert_eq!(statements.len(), 1, "{sql}");
        admit(&statements[0])
    }

    #[test]
    fn the_gate_applies_to_postgres_statements() {
        for sql in [
            "SELECT 1",
            "SELECT * FROM gpu_metrics",
            "SELECT c.relname FROM pg_catalog.pg_class c",
            "EXPLAIN SELECT 1",
        ] {
            assert_eq!(verdict(sql).expect(sql), Verdict::Query, "{sql}");
        }
        for sql in [
            "SET statement_timeout = 1000",
            "SET application_name = 'psql'",
            "BEGIN",
            "COMMIT",
            "SHOW server_version",
        ] {
            assert_eq!(verdict(sql).expect(sql), Verdict::Session, "{sql}");
        }
        for sql in ["FETCH NEXT FROM c", "FETCH 10 FROM c", "FETCH ALL FROM c"] {
            assert_eq!(verdict(sql).expect(sql), Verdict::Fetch, "{sql}");
        }
        assert_eq!(
            verdict("DECLARE c CURSOR FOR SELECT 1").expect("declare"),
            Verdict::Declare("c".to_string())
        );
        assert_eq!(
            verdict("DECLARE \"Big\" CURSOR FOR SELECT 1").expect("declare"),
            Verdict::Declare("Big".to_string())
        );
        for sql in ["CLOSE c", "CLOSE ALL"] {
            assert_eq!(verdict(sql).expect(sql), Verdict::Close, "{sql}");
        }
        for sql in ["SET client_encoding = 'UTF8'", "SET TIME ZONE 'UTC'"] {
            assert_eq!(verdict(sql).expect(sql), Verdict::IgnoredSet, "{sql}");
        }
        for sql in [
            "INSERT INTO gpu_metrics (host) VALUES ('x')",
            "CREATE TABLE t AS SELECT 1",
            "DROP TABLE gpu_metrics",
            "COPY gpu_metrics TO '/tmp/x.csv'",
            "SET datafusion.execution.target_partitions = 1",
            "DECLARE c CURSOR FOR SELECT * FROM '/etc/passwd'",
            "SELECT * FROM read_parquet('/tmp/x.parquet')",
            "DELETE FROM gpu_metrics",
        ] {
            match verdict(sql) {
                Err(Error::NotAllowed(msg)) => assert!(msg.contains("not allowed"), "{msg}"),
                other => panic!("{sql}: expected a refusal, got {other:?}"),
            }
        }
    }
}
