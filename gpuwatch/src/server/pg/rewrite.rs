//! Rewrites of client metadata queries that DataFusion cannot plan, applied to the SQL text the
//! Postgres front end receives before anything else sees it.
//!
//! Grafana's PostgreSQL data source finds the schemas of the search path with a subquery that
//! expands `current_setting('search_path')` into rows through set-returning functions in `FROM`:
//!
//! ```sql
//! quote_ident(table_schema) IN (
//!   SELECT CASE WHEN trim(s[i]) = '"$user"' THEN user ELSE trim(s[i]) END
//!   FROM generate_series(array_lower(string_to_array(current_setting('search_path'),','),1),
//!                        array_upper(string_to_array(current_setting('search_path'),','),1)) as i,
//!        string_to_array(current_setting('search_path'),',') s)
//! ```
//!
//! Its query builder uses it to list tables and, once a table is picked, its columns. The search
//! path here is fixed (`public`, which `current_setting('search_path')` answers), so every
//! parenthesised `SELECT` that expands the search path this way is replaced by the list it
//! would give: `('public')`. Nothing else in the statement changes, and a statement without
//! that subquery is passed through untouched (borrowed, not copied).

use std::borrow::Cow;

/// The schemas of the search path, as an SQL list.
const SEARCH_PATH_LIST: &str = "('public')";

/// `sql` with every search-path subquery replaced by the search path's schemas.
pub(crate) fn rewrite(sql: &str) -> Cow<'_, str> {
    if !contains_ignore_case(sql, "current_setting('search_path')") {
        return Cow::Borrowed(sql);
    }
    let mut out = String::with_capacity(sql.len());
    let mut rest = 0usize;
    let mut pos = 0usize;
    let bytes = sql.as_bytes();
    while let Some(open) = next_subquery(sql, pos) {
        let Some(close) = matching_paren(bytes, open) else {
            break;
        };
        let inner = &sql[open + 1..close];
        if expands_search_path(inner) {
            out.push_str(&sql[rest..open]);
            out.push_str(SEARCH_PATH_LIST);
            rest = close + 1;
            pos = close + 1;
        } else {
            pos = open + 1;
        }
    }
    if rest == 0 {
        return Cow::Borrowed(sql);
    }
    out.push_str(&sql[rest..]);
    Cow::Owned(out)
}

/// Whether a subquery's text is the search-path expansion.
fn expands_search_path(inner: &str) -> bool {
    contains_ignore_case(inner, "string_to_array(current_setting('search_path')")
        && contains_ignore_case(inner, "generate_series")
}

fn contains_ignore_case(haystack: &str, needle: &str) -> bool {
    let (h, n) = (haystack.as_bytes(), needle.as_bytes());
    n.is_empty() || h.windows(n.len()).any(|w| w.eq_ignore_ascii_case(n))
}

/// The position of the next `(` at or after `from` that opens a `SELECT` (outside string
/// literals and quoted identifiers).
fn next_subquery(sql: &str, from: usize) -> Option<usize> {
    let bytes = sql.as_bytes();
    let mut i = from;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' | b'"' => i = skip_quoted(bytes, i),
            b'(' => {
                let after = sql[i + 1..].trim_start();
                if after.len() >= 6
                    && after.as_bytes()[..6].eq_ignore_ascii_case(b"select")
                    && after
                        .as_bytes()
                        .get(6)
                        .is_none_or(|c| !c.is_ascii_alphanumeric() && *c != b'_')
                {
                    return Some(i);
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    None
}

/// The position of the `)` that closes the `(` at `open`, skipping quoted text.
fn matching_paren(bytes: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = open;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' | b'"' => {
                i = skip_quoted(bytes, i);
                continue;
            }
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The position just after the quoted text that starts at `start` (a doubled quote is part of
/// the text); the end of the input when it is not closed.
fn skip_quoted(bytes: &[u8], start: usize) -> usize {
    let quote = bytes[start];
    let mut i = start + 1;
    while i < bytes.len() {
        if bytes[i] == quote {
            if bytes.get(i + 1) == Some(&quote) {
                i += 2;
                continue;
            }
            return i + 1;
        }
        i += 1;
    }
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONSTRAINT: &str = r#"
          quote_ident(table_schema) IN (
          SELECT
            CASE WHEN trim(s[i]) = '"$user"' THEN user ELSE trim(s[i]) END
          FROM
            generate_series(
              array_lower(string_to_array(current_setting('search_path'),','),1),
              array_upper(string_to_array(current_setting('search_path'),','),1)
            ) as i,
            string_to_array(current_setting('search_path'),',') s
          )"#;

    #[test]
    fn the_search_path_subquery_becomes_a_list() {
        let sql = format!(
            "SELECT CASE WHEN {CONSTRAINT} THEN quote_ident(table_name) ELSE 'x' END FROM t \
             ORDER BY CASE WHEN {CONSTRAINT} THEN 0 ELSE 1 END, 1"
        );
        let out = rewrite(&sql);
        assert_eq!(
            out.matches("quote_ident(table_schema) IN ('public')")
                .count(),
            2,
            "{out}"
        );
        assert!(!out.contains("generate_series"), "{out}");
        assert!(out.ends_with("ELSE 1 END, 1"), "{out}");
    }

    #[test]
    fn other_statements_pass_through_unchanged() {
        for sql in [
            "SELECT 1",
            "SELECT current_setting('search_path')",
            "SELECT x FROM t WHERE y IN (SELECT z FROM u)",
            "SELECT '(select generate_series current_setting(''search_path'')' AS s",
            "SELECT (SELECT 1",
        ] {
            assert!(matches!(rewrite(sql), Cow::Borrowed(_)), "{sql}");
        }
    }

    #[test]
    fn unbalanced_or_quoted_input_never_panics() {
        for sql in [
            "SELECT current_setting('search_path') (",
            "(select generate_series(string_to_array(current_setting('search_path'),','))",
            "(select 'unterminated current_setting('search_path') generate_series",
            "\"(select\" current_setting('search_path')",
            "(SELECT",
        ] {
            let _ = rewrite(sql);
        }
    }
}
