//! The statement gate: only read-only statements reach the planner.
//!
//! Allowed: `SELECT` / `WITH` queries, `EXPLAIN` (and `EXPLAIN ANALYZE`) of an allowed statement,
//! `SHOW TABLES`, `SHOW COLUMNS`, `SHOW <variable>`, `DESCRIBE`. Everything else — `COPY … TO`,
//! `CREATE EXTERNAL TABLE`, `INSERT`, `SET`, DDL — is refused before planning. So is any table
//! reference that names a file or URL (`FROM '/etc/passwd'`, `FROM 's3://b/x.parquet'`) and any
//! table function that reads files (`read_parquet`, `read_csv`, `parquet_metadata`, …): none is
//! registered today, but refusing them by name keeps a future registration (or URL tables) from
//! opening the server's files to SQL users. The planner is also run with DDL, DML and statements
//! disabled, as a second line.

use std::ops::ControlFlow;

use datafusion::sql::parser::{DFParser, Statement};
use datafusion::sql::sqlparser::ast::Statement as Sql;
use datafusion::sql::sqlparser::ast::{ObjectName, visit_relations};
use datafusion::sql::sqlparser::dialect::GenericDialect;

use crate::Result;
use crate::error::{Error, lower_first};

/// The longest statement text read (1 MiB); a longer one is refused before it is parsed.
pub const MAX_SQL_BYTES: usize = 1 << 20;

/// The most operators one statement may hold.
///
/// `a + b + c + …` parses into a tree as deep as its operators are many, and the planner and
/// optimizer walk expression trees recursively: a statement of 50,000 additions overflows a
/// thread's stack, which aborts the process. Parentheses, function calls, subqueries and
/// unary operators are bounded by the parser's own recursion limit (50); chains of binary
/// operators are not, so they are counted here, on the tokens, before anything is parsed.
pub const MAX_OPERATORS: usize = 2_000;

/// Refuses a statement text longer than [`MAX_SQL_BYTES`], or with more than
/// [`MAX_OPERATORS`] operators, before it is parsed.
pub fn check_length(sql: &str) -> Result<()> {
    if sql.len() > MAX_SQL_BYTES {
        return Err(Error::StatementTooLong(sql.len(), MAX_SQL_BYTES));
    }
    let operators = count_operators(sql);
    if operators > MAX_OPERATORS {
        return Err(Error::BadSql(format!(
            "the statement has {operators} operators, more than {MAX_OPERATORS}: use IN lists, CASE or fewer terms"
        )));
    }
    Ok(())
}

/// The binary operators of `sql` (an upper bound of how deep its expression trees can get
/// without parentheses). Text that does not tokenize is left to the parser to refuse.
fn count_operators(sql: &str) -> usize {
    use datafusion::sql::sqlparser::keywords::Keyword;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else {
        return 0;
    };
    tokens
        .iter()
        .filter(|t| match t {
            Token::Word(w) => matches!(
                w.keyword,
                Keyword::AND
                    | Keyword::OR
                    | Keyword::XOR
                    | Keyword::IS
                    | Keyword::LIKE
                    | Keyword::ILIKE
                    | Keyword::SIMILAR
                    | Keyword::BETWEEN
                    | Keyword::COLLATE
                    | Keyword::AT
            ),
            Token::EOF
            | Token::Number(..)
            | Token::Char(_)
            | Token::Comma
            | Token::Whitespace(_)
            | Token::LParen
            | Token::RParen
            | Token::Period
            | Token::SemiColon
            | Token::LBracket
            | Token::RBracket
            | Token::LBrace
            | Token::RBrace
            | Token::Placeholder(_) => false,
            other => !is_literal(other),
        })
        .count()
}

/// String literals of every kind.
fn is_literal(t: &datafusion::sql::sqlparser::tokenizer::Token) -> bool {
    use datafusion::sql::sqlparser::tokenizer::Token;
    matches!(
        t,
        Token::SingleQuotedString(_)
            | Token::DoubleQuotedString(_)
            | Token::TripleSingleQuotedString(_)
            | Token::TripleDoubleQuotedString(_)
            | Token::DollarQuotedString(_)
            | Token::SingleQuotedByteStringLiteral(_)
            | Token::DoubleQuotedByteStringLiteral(_)
            | Token::TripleSingleQuotedByteStringLiteral(_)
            | Token::TripleDoubleQuotedByteStringLiteral(_)
            | Token::SingleQuotedRawStringLiteral(_)
            | Token::DoubleQuotedRawStringLiteral(_)
            | Token::TripleSingleQuotedRawStringLiteral(_)
            | Token::TripleDoubleQuotedRawStringLiteral(_)
            | Token::NationalStringLiteral(_)
            | Token::QuoteDelimitedStringLiteral(_)
            | Token::NationalQuoteDelimitedStringLiteral(_)
            | Token::EscapedStringLiteral(_)
            | Token::UnicodeStringLiteral(_)
            | Token::HexStringLiteral(_)
    )
}

/// Checks that `sql` is exactly one read-only statement.
pub fn check(sql: &str) -> Result<()> {
    check_length(sql)?;
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

/// Checks one statement that another parser already produced (the Postgres wire front end parses
/// with its own Postgres-compatible parser): the same rules as [`check`].
pub fn check_parsed(statement: &Sql) -> Result<()> {
    allowed_sql(statement)?;
    relations_allowed(statement)
}

fn refuse(what: &str) -> Error {
    Error::NotAllowed(format!(
        "statement {what} is not allowed: only SELECT, WITH, EXPLAIN, SHOW and DESCRIBE are"
    ))
}

/// Table functions that read files or URLs in DataFusion's CLI, DuckDB and friends.
const FILE_FUNCTIONS: &[&str] = &[
    "read_parquet",
    "parquet_scan",
    "parquet_metadata",
    "read_csv",
    "read_csv_auto",
    "read_json",
    "read_json_auto",
    "read_ndjson",
    "read_avro",
    "read_arrow",
    "read_text",
    "read_blob",
    "read_file",
    "glob",
    "iceberg_scan",
    "delta_scan",
];

/// Refuses table references that read files or URLs.
fn relations_allowed(s: &Sql) -> Result<()> {
    let flow = visit_relations(s, |name: &ObjectName| {
        let text = name.to_string();
        let unquoted = text.trim_matches(|c| c == '\'' || c == '"' || c == '`');
        let lower = unquoted.to_ascii_lowercase();
        let last = lower.rsplit('.').next().unwrap_or("");
        let path_like = unquoted.contains('/') || unquoted.contains('\\') || lower.contains("://");
        let file_like = [".parquet", ".csv", ".json", ".ndjson", ".avro", ".arrow"]
            .iter()
            .any(|ext| lower.ends_with(ext));
        if path_like || file_like || FILE_FUNCTIONS.contains(&last) {
            return ControlFlow::Break(text);
        }
        ControlFlow::Continue(())
    });
    match flow {
        ControlFlow::Break(what) => Err(Error::NotAllowed(format!(
            "reading files or urls ({what}) is not allowed: query the tables gpu_metrics, metrics and information_schema"
        ))),
        ControlFlow::Continue(()) => Ok(()),
    }
}

fn allowed(stmt: &Statement) -> Result<()> {
    match stmt {
        Statement::Statement(s) => {
            allowed_sql(s)?;
            relations_allowed(s)
        }
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
    fn file_and_url_reads_are_forbidden() {
        for sql in [
            "SELECT * FROM '/etc/passwd'",
            "SELECT * FROM 'data/x.parquet'",
            "SELECT * FROM \"/etc/shadow\"",
            "SELECT * FROM 's3://bucket/x.parquet'",
            "SELECT * FROM 'https://example.com/x.csv'",
            "SELECT * FROM read_parquet('/tmp/x.parquet')",
            "SELECT * FROM read_csv('x')",
            "SELECT * FROM parquet_metadata('gpuwatch-data/x.parquet')",
            "WITH a AS (SELECT * FROM read_json('/x')) SELECT * FROM a",
            "SELECT * FROM gpu_metrics WHERE host IN (SELECT * FROM '/etc/hosts')",
            "SELECT * FROM gpu_metrics JOIN 'x.parquet' USING (host)",
            "EXPLAIN SELECT * FROM '/etc/passwd'",
        ] {
            match check(sql) {
                Err(Error::NotAllowed(msg)) => assert!(msg.contains("files or urls"), "{msg}"),
                other => panic!("{sql}: expected 403, got {other:?}"),
            }
        }
        for sql in [
            "SELECT * FROM generate_series(1, 3)",
            "SELECT * FROM information_schema.tables",
            "SELECT * FROM gpuwatch.public.gpu_metrics",
            "SELECT '/etc/passwd' AS path",
        ] {
            assert!(check(sql).is_ok(), "{sql}: {:?}", check(sql));
        }
    }

    #[test]
    fn bad_sql_is_a_bad_request() {
        for sql in ["", "SELEC 1", "SELECT 1; SELECT 2"] {
            assert!(matches!(check(sql), Err(Error::BadSql(_))), "{sql}");
        }
    }
}
