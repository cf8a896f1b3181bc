//! The statement gate: only read-only statements reach the planner.
//!
//! Allowed: `SELECT` / `WITH` queries, `EXPLAIN` (and `EXPLAIN ANALYZE`) of an allowed statement,
//! `SHOW TABLES`, `SHOW COLUMNS`, `SHOW <variable>`, `DESCRIBE`. Everything else — `COPY … TO`,
//! `CREATE EXTERNAL TABLE`, `INSERT`, `SET`, DDL — is refused before planning. The planner is
//! also run with DDL, DML and statements disabled, as a second line.

use datafusion::sql::parser::{DFParser, Statement};
use datafusion::sql::sqlparser::ast::Statement as Sql;
use datafusion::sql::sqlparser::dialect::GenericDialect;

use crate::Result;
use crate::error::{Error, lower_first};

/// Checks that `sql` is exactly one read-only statement.
pub fn check(sql: &str) -> Result<()> {
    let statements = DFParser::parse_sql_with_dialect(sql, &GenericDialect {})
        .map_err(|e| Error::BadSql(lower_first(&e.to_string())))?;
    match statements.len() {
        0 => return Err(Error::BadSql("empty statement: send one SELECT".into())),
        1 => {}
        n => {
            return Err(Error::BadSql(format!(
                "{n} statements in one request: send one at a time"
            )));
        }
    }
    allowed(&statements[0])
}

fn refuse(what: &str) -> Error {
    Error::NotAllowed(format!(
        "statement {what} is not allowed: only SELECT, WITH, EXPLAIN, SHOW and DESCRIBE are"
    ))
}

fn allowed(stmt: &Statement) -> Result<()> {
    match stmt {
        Statement::Statement(s) => allowed_sql(s),
        Statement::Explain(e) => allowed(&e.statement),
        Statement::CreateExternalTable(_) => Err(refuse("CREATE EXTERNAL TABLE")),
        Statement::CopyTo(_) => Err(refuse("COPY")),
        Statement::Reset(_) => Err(refuse("RESET")),
    }
}

fn allowed_sql(s: &Sql) -> Result<()> {
    match s {
        Sql::Query(_)
        | Sql::ShowTables { .. }
        | Sql::ShowColumns { .. }
        | Sql::ShowVariable { .. }
        | Sql::ExplainTable { .. } => Ok(()),
        Sql::Explain { statement, .. } => allowed_sql(statement),
        other => {
            let text = other.to_string();
            let keyword: String = text
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")
                .to_uppercase();
            Err(refuse(&keyword))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_statements_pass() {
        for sql in [
            "SELECT 1",
            "select * from gpu_metrics where time > now() - interval '5 minutes'",
            "WITH x AS (SELECT 1 AS a) SELECT a FROM x",
            "EXPLAIN SELECT 1",
            "EXPLAIN ANALYZE SELECT 1",
            "SHOW TABLES",
            "SHOW COLUMNS FROM gpu_metrics",
            "DESCRIBE gpu_metrics",
            "SELECT 1;",
        ] {
            assert!(check(sql).is_ok(), "{sql}: {:?}", check(sql));
        }
    }

    #[test]
    fn writes_and_file_access_are_forbidden() {
        for sql in [
            "COPY (SELECT 1) TO '/tmp/x.csv'",
            "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/etc/passwd'",
            "INSERT INTO gpu_metrics VALUES (1)",
            "SET datafusion.execution.batch_size = 1",
            "CREATE TABLE t AS SELECT 1",
            "DROP TABLE gpu_metrics",
            "EXPLAIN COPY (SELECT 1) TO '/tmp/x.csv'",
            "EXPLAIN INSERT INTO gpu_metrics VALUES (1)",
            "CREATE VIEW v AS SELECT 1",
        ] {
            match check(sql) {
                Err(Error::NotAllowed(msg)) => assert!(msg.contains("not allowed"), "{msg}"),
                other => panic!("{sql}: expected 403, got {other:?}"),
            }
        }
    }

    #[test]
    fn bad_sql_is_a_bad_request() {
        for sql in ["", "SELEC 1", "SELECT 1; SELECT 2"] {
            assert!(matches!(check(sql), Err(Error::BadSql(_))), "{sql}");
        }
    }
}
