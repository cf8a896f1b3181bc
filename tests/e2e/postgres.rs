//! The Postgres wire protocol, driven by the real `psql`: catalog commands, typed rows, the
//! read-only gate and SQLSTATEs, token logins, and the SQL Grafana's PostgreSQL data source sends
//! (tests/fixtures/grafana_postgres_macros.sql).

use gpuwatch_e2e::TestServer;

use crate::post_otlp;

/// 2025-06-01T11:50:00Z: the first sample.
const FIRST: i64 = 1_748_778_600;
/// Samples, one a minute: 11:50 to 13:10.
const SAMPLES: i64 = 81;

/// The utilisation of sample `i` (a distinct value per sample, so averages tell buckets apart).
fn util(i: i64) -> f64 {
    ((i * 37) % 100) as f64 / 100.0
}

/// Sample `i` of GPU-0 on node-1 as an OTLP/JSON export.
fn sample(i: i64) -> String {
    let t = (FIRST + i * 60) * 1_000_000_000;
    let attrs = serde_json::json!([{"key": "hw.id", "value": {"stringValue": "GPU-0"}}]);
    let gauge = |name: &str, v: f64| {
        serde_json::json!({"name": name, "gauge": {"dataPoints": [
            {"timeUnixNano": t.to_string(), "asDouble": v, "attributes": attrs}
        ]}})
    };
    serde_json::json!({"resourceMetrics": [{
        "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "node-1"}}]},
        "scopeMetrics": [{"metrics": [
            gauge("hw.gpu.utilization", util(i)),
            gauge("hw.power", 100.0 + i as f64),
        ]}]
    }]})
    .to_string()
}

async fn load(server: &TestServer) {
    for i in 0..SAMPLES {
        let (status, body) = post_otlp(
            &server.url(),
            "application/json",
            None,
            sample(i).into_bytes(),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
}

fn start(dir: &std::path::Path, extra: &[&str]) -> TestServer {
    let mut b = TestServer::builder()
        .data_dir(&dir.join("d"))
        // Keeps the 2025 samples in the buffer and out of retention's way during the test.
        .arg("--compaction-interval")
        .arg("1h");
    for a in extra {
        b = b.arg(a);
    }
    b.start()
}

/// Runs `sql` with psql (no password); panics with psql's stderr when it fails.
fn ok(server: &TestServer, sql: &str) -> String {
    let out = server.psql(None, "disable", &["-c", sql]);
    assert!(out.ok, "{sql}: {}", out.stderr);
    out.stdout
}

/// Runs `sql` with psql; it must fail with `sqlstate`; returns stderr.
fn fails(server: &TestServer, sql: &str, sqlstate: &str) -> String {
    let out = server.psql(None, "disable", &["-c", sql]);
    assert!(!out.ok, "{sql} should fail, printed {}", out.stdout);
    assert!(
        out.stderr.contains(&format!("ERROR:  {sqlstate}:")),
        "{sql}: expected SQLSTATE {sqlstate}, got: {}",
        out.stderr
    );
    out.stderr
}

#[tokio::test(flavor = "multi_thread")]
async fn psql_lists_describes_and_reads_typed_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), &[]);
    load(&server).await;

    let tables = ok(&server, "\\dt");
    for t in ["gpu_metrics", "gpu_metrics_1m", "metrics", "alerts"] {
        assert!(
            tables.lines().any(|l| l.split('|').nth(1) == Some(t)),
            "\\dt lacks {t}: {tables}"
        );
    }

    let described = ok(&server, "\\d gpu_metrics");
    let column = |name: &str| -> String {
        described
            .lines()
            .find(|l| l.split('|').next() == Some(name))
            .unwrap_or_else(|| panic!("\\d gpu_metrics lacks {name}: {described}"))
            .split('|')
            .nth(1)
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(column("time"), "timestamp with time zone");
    assert_eq!(column("gpu_utilization"), "double precision");
    assert_eq!(column("host"), "text");

    // Typed values: a timestamp, a float, an integer count and text.
    let row = ok(
        &server,
        "SELECT time, host, gpu_utilization, power_watts FROM gpu_metrics ORDER BY time LIMIT 2",
    );
    let lines: Vec<&str> = row.lines().collect();
    assert_eq!(lines.len(), 2, "{row}");
    for (i, line) in lines.iter().enumerate() {
        let f: Vec<&str> = line.split('|').collect();
        assert_eq!(f.len(), 4, "{line}");
        assert_eq!(f[0], timestamp_text(FIRST + i as i64 * 60), "{line}");
        assert_eq!(f[1], "node-1", "{line}");
        assert!(
            close(f[2].parse().expect("float"), util(i as i64)),
            "{line}"
        );
        assert!(
            close(f[3].parse().expect("float"), 100.0 + i as f64),
            "{line}"
        );
    }
    let counted = ok(
        &server,
        "SELECT count(*), pg_typeof(count(*)) FROM gpu_metrics",
    );
    assert_eq!(counted.trim(), format!("{SAMPLES}|bigint"));
    let sum = ok(
        &server,
        "SELECT round(sum(power_watts)) FROM gpu_metrics WHERE time >= '2025-06-01T12:00:00Z'",
    );
    let want: i64 = (10..SAMPLES).map(|i| 100 + i).sum();
    assert!(
        close(sum.trim().parse().expect("number"), want as f64),
        "{sum}"
    );

    // Several statements in one query string, as psql -c sends them.
    let two = ok(&server, "SELECT 1; SELECT 'two'");
    assert_eq!(two.trim(), "1\ntwo");
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_and_bad_statements_get_sqlstates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), &[]);

    for sql in [
        "DROP TABLE gpu_metrics",
        "INSERT INTO gpu_metrics (host) VALUES ('x')",
        "CREATE TABLE t AS SELECT 1",
        "COPY (SELECT 1) TO '/tmp/gpuwatch-pg-copy.csv'",
        "SELECT * FROM '/etc/passwd'",
        "SET datafusion.execution.target_partitions = 1",
    ] {
        let err = fails(&server, sql, "42501");
        assert!(err.contains("not allowed"), "{sql}: {err}");
    }
    assert!(!std::path::Path::new("/tmp/gpuwatch-pg-copy.csv").exists());
    fails(&server, "SELEC 1", "42601");
    fails(&server, "SELECT * FROM no_such_table", "42P01");
    fails(&server, "SELECT no_such_column FROM gpu_metrics", "42703");
    fails(&server, "SELECT no_such_function(1)", "42883");
    let err = fails(&server, "SELECT labels FROM metrics", "0A000");
    assert!(err.contains("labels['host']"), "{err}");

    // The connection's statement_timeout (here far below --query-timeout) cancels a long query.
    let out = server.psql(
        None,
        "disable",
        &[
            "-c",
            "SET statement_timeout = 1",
            "-c",
            "SELECT count(*) FROM generate_series(1, 500000000)",
        ],
    );
    assert!(!out.ok, "the query should be cancelled: {}", out.stdout);
    assert!(out.stderr.contains("ERROR:  57014:"), "{}", out.stderr);

    // Session statements clients send are accepted; the connection stays usable.
    let out = ok(
        &server,
        "SET application_name = 'e2e'; SET client_encoding = 'UTF8'; BEGIN; SELECT 42; COMMIT",
    );
    assert!(out.contains("42"), "{out}");
}

/// A join of `n` generated rows with `n` others: its hash table (which cannot spill) holds
/// about 17 bytes a row, so a little over half of a 32 MiB limit for [`ROWS`].
fn join(n: usize) -> String {
    format!(
        "SELECT count(*) FROM generate_series(1, {n}) a(x) JOIN generate_series(1, {n}) b(y) ON a.x = b.y"
    )
}

/// Rows of [`join`]: the query fits the limit below; twice as many do not.
const ROWS: usize = 1_200_000;
const MEMORY_LIMIT: &str = "33554432";

/// An interactive psql session (quiet, unaligned, tuples only) on `server`'s Postgres listener.
struct Session {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Session {
    fn open(server: &TestServer) -> Self {
        Self::open_with(server, true)
    }

    /// A session that goes on after an error when `!stop_on_error` (read the error's SQLSTATE
    /// with `\echo :SQLSTATE`).
    fn open_with(server: &TestServer, stop_on_error: bool) -> Self {
        use std::process::{Command, Stdio};
        let conninfo = format!(
            "host={} port={} user=grafana dbname=gpuwatch sslmode=disable connect_timeout=10",
            server.pg.ip(),
            server.pg.port()
        );
        let mut child = Command::new("psql")
            .arg(conninfo)
            .args([
                "-X",
                "-w",
                "-q",
                "-At",
                "-v",
                if stop_on_error {
                    "ON_ERROR_STOP=1"
                } else {
                    "ON_ERROR_STOP=0"
                },
                "-v",
                "VERBOSITY=verbose",
            ])
            .env_remove("PGPASSWORD")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run psql (package postgresql-client)");
        let stdin = child.stdin.take().expect("psql stdin");
        let stdout = std::io::BufReader::new(child.stdout.take().expect("psql stdout"));
        Self {
            child,
            stdin,
            stdout,
        }
    }

    /// Sends `sql` and reads the one line it prints.
    fn line(&mut self, sql: &str) -> String {
        use std::io::{BufRead, Write};
        writeln!(self.stdin, "{sql}").expect("write to psql");
        self.stdin.flush().expect("flush psql");
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line).expect("read psql");
        if n == 0 {
            let mut err = String::new();
            if let Some(mut e) = self.child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!("psql ended before printing a line for {sql}: {err}");
        }
        line.trim_end().to_string()
    }

    /// Quits; panics when psql failed.
    fn quit(mut self) {
        use std::io::Write;
        writeln!(self.stdin, "\\q").expect("write to psql");
        drop(self.stdin);
        let out = self.child.wait_with_output().expect("psql exits");
        assert!(
            out.status.success(),
            "psql: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `--query-memory-limit` holds for each statement over the Postgres protocol, as over HTTP:
/// a statement over it fails with 53200 and leaves its connection usable; statements under it
/// run while another statement holds most of the limit, on another connection or on the same.
#[tokio::test(flavor = "multi_thread")]
async fn the_memory_limit_is_per_statement() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), &["--query-memory-limit", MEMORY_LIMIT]);

    // Twice the rows need more than the limit: an answer, and the connection goes on.
    let out = server.psql(
        None,
        "disable",
        &[
            "-v",
            "ON_ERROR_STOP=0",
            "-c",
            &join(2 * ROWS),
            "-c",
            "SELECT 'still connected'",
        ],
    );
    assert!(
        out.stderr.contains("ERROR:  53200:") && out.stderr.contains("--query-memory-limit"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stdout.trim(), "still connected", "{}", out.stderr);

    // Connection one keeps a join's hash table in memory: a cursor over it, one row fetched.
    let mut one = Session::open(&server);
    let held = join(ROWS).replace("SELECT count(*)", "SELECT a.x");
    assert_eq!(
        one.line(&format!(
            "DECLARE held CURSOR FOR {held}; FETCH 1 FROM held;"
        ))
        .parse::<usize>()
        .map(|x| (1..=ROWS).contains(&x)),
        Ok(true)
    );
    // With one pool for all statements, the same join elsewhere would not fit beside it.
    let other = server.psql(None, "disable", &["-c", &join(ROWS)]);
    assert!(other.ok, "another connection: {}", other.stderr);
    assert_eq!(other.stdout.trim(), ROWS.to_string());
    assert_eq!(one.line(&format!("{};", join(ROWS))), ROWS.to_string());
    // The cursor still reads on.
    assert!(one.line("FETCH 1 FROM held;").parse::<usize>().is_ok());
    assert_eq!(one.line("CLOSE held; SELECT 'closed';"), "closed");
    one.quit();

    // The same over the extended protocol (prepared statements), from psycopg 3.
    let text = psycopg(&server, PSYCOPG_MEMORY, &[&join(2 * ROWS), &join(ROWS)]);
    assert_eq!(text.trim(), format!("refused 53200\n{ROWS}"), "{text}");
}

/// An open cursor holds one of the `--max-concurrent-queries` slots from its DECLARE until it is
/// closed (CLOSE, CLOSE ALL, the end of its connection), not freed by COMMIT; its FETCHes run
/// under that slot, and a DECLARE when no slot is free is refused with 53000 and opens nothing.
#[tokio::test(flavor = "multi_thread")]
async fn open_cursors_hold_query_slots() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), &["--max-concurrent-queries", "1"]);
    let cursor = "SELECT x FROM generate_series(1, 1000) t(x) ORDER BY x";
    // Another connection's query, while the slot is taken.
    let refused = || {
        fails(&server, "SELECT 1", "53000");
    };

    let mut a = Session::open_with(&server, false);
    assert_eq!(
        a.line(&format!(
            "BEGIN; DECLARE c CURSOR FOR {cursor}; FETCH 1 FROM c;"
        )),
        "1"
    );
    refused();
    // With the one slot held by the cursor, its connection still fetches from it.
    assert_eq!(a.line("FETCH 1 FROM c;"), "2");
    // COMMIT leaves the cursor open (as datafusion-postgres keeps it), and its slot taken.
    assert_eq!(a.line("COMMIT; FETCH 1 FROM c;"), "3");
    refused();
    // A second cursor needs a second slot: refused, and not opened.
    assert_eq!(
        a.line("DECLARE d CURSOR FOR SELECT 1;\n\\echo :SQLSTATE"),
        "53000"
    );
    assert_eq!(a.line("FETCH 1 FROM d;\n\\echo :SQLSTATE"), "34000");
    assert_eq!(a.line("FETCH 1 FROM c;"), "4");
    // A DECLARE of c again replaces c under c's slot.
    assert_eq!(
        a.line("DECLARE c CURSOR FOR SELECT 42; FETCH 1 FROM c;"),
        "42"
    );
    refused();
    assert_eq!(a.line("CLOSE c; SELECT 'closed';"), "closed");
    assert_eq!(ok(&server, "SELECT 7").trim(), "7");
    // CLOSE ALL frees the slot too.
    assert_eq!(
        a.line(&format!("DECLARE c CURSOR FOR {cursor}; FETCH 1 FROM c;")),
        "1"
    );
    refused();
    assert_eq!(a.line("CLOSE ALL; SELECT 'closed';"), "closed");
    assert_eq!(ok(&server, "SELECT 7").trim(), "7");
    // In one simple query (psql -c sends it whole), a query after a CLOSE gets the slot the
    // cursor freed.
    assert_eq!(
        ok(
            &server,
            "DECLARE c CURSOR FOR SELECT 5; FETCH 1 FROM c; CLOSE c; SELECT 6"
        )
        .lines()
        .collect::<Vec<_>>(),
        ["DECLARE CURSOR", "5", "CLOSE CURSOR", "6"]
    );

    // The time limit (here the connection's statement_timeout of 1 ms) cuts off a query, and not
    // the FETCH that runs a cursor's query.
    let long = "SELECT count(*) FROM generate_series(1, 10000000)";
    assert_eq!(
        a.line(&format!(
            "DECLARE t CURSOR FOR {long}; SET statement_timeout = 1; FETCH 1 FROM t;"
        )),
        "10000000"
    );
    assert_eq!(
        a.line(&format!("CLOSE t; {long};\n\\echo :SQLSTATE")),
        "57014"
    );
    assert_eq!(
        a.line("SET statement_timeout = 0; SELECT 'reset';"),
        "reset"
    );

    // A connection that ends with a cursor open frees its slot.
    assert_eq!(
        a.line(&format!("DECLARE c CURSOR FOR {cursor}; FETCH 1 FROM c;")),
        "1"
    );
    refused();
    a.quit();
    // psql has exited, but the server frees the slot once it reads the end of the connection,
    // which happens on its own task after psql is gone: retry, a bounded number of times.
    let mut freed = false;
    for _ in 0..200 {
        let out = server.psql(None, "disable", &["-c", "SELECT 7"]);
        if out.ok {
            assert_eq!(out.stdout.trim(), "7");
            freed = true;
            break;
        }
        assert!(out.stderr.contains("53000"), "{}", out.stderr);
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    assert!(
        freed,
        "the slot of the ended connection's cursor is still taken"
    );

    // The same over the extended protocol (DECLARE and CLOSE as prepared statements), psycopg 3.
    let text = psycopg(&server, PSYCOPG_CURSORS, &[cursor]);
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        ["1", "53000", "2", "53000", "34000", "42", "53000", "7"],
        "{text}"
    );
}

/// Two connections: `a` declares a cursor over argv[2] (prepared), `b` queries meanwhile.
const PSYCOPG_CURSORS: &str = r#"
import sys, psycopg
def state(conn, sql, **kw):
    try:
        conn.execute(sql, **kw)
        return "ok"
    except psycopg.Error as e:
        return e.sqlstate
with psycopg.connect(sys.argv[1], autocommit=True) as a, psycopg.connect(sys.argv[1], autocommit=True) as b:
    a.execute("DECLARE c CURSOR FOR " + sys.argv[2], prepare=True)
    print(a.execute("FETCH 1 FROM c").fetchone()[0])
    print(state(b, "SELECT 1"))
    print(a.execute("FETCH 1 FROM c").fetchone()[0])
    print(state(a, "DECLARE d CURSOR FOR SELECT 1", prepare=True))
    print(state(a, "FETCH 1 FROM d"))
    a.execute("DECLARE c CURSOR FOR SELECT 42", prepare=True)
    print(a.execute("FETCH 1 FROM c").fetchone()[0])
    print(state(b, "SELECT 1"))
    a.execute("CLOSE c", prepare=True)
    print(b.execute("SELECT 7").fetchone()[0])
"#;

/// Runs argv[2] (over the limit) and argv[3] as prepared statements on one connection.
const PSYCOPG_MEMORY: &str = r#"
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    cur = conn.cursor(binary=True)
    try:
        cur.execute(sys.argv[2], prepare=True)
        print("answered", cur.fetchall())
    except psycopg.Error as e:
        print("refused", e.sqlstate)
    cur.execute(sys.argv[3], prepare=True)
    print(cur.fetchone()[0])
"#;

#[tokio::test(flavor = "multi_thread")]
async fn logins_need_a_query_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = crate::tokens_file(dir.path());
    let server = start(dir.path(), &["--auth-tokens", &tokens]);

    let good = server.psql(
        Some("query-token-0123456789"),
        "disable",
        &["-c", "SELECT 7"],
    );
    assert!(good.ok, "{}", good.stderr);
    assert_eq!(good.stdout.trim(), "7");

    let wrong = server.psql(
        Some("query-token-012345678X"),
        "disable",
        &["-c", "SELECT 7"],
    );
    assert!(!wrong.ok);
    assert!(
        wrong.stderr.contains("password authentication failed"),
        "{}",
        wrong.stderr
    );
    // psql does not print the SQLSTATE of a failed login: read it off the wire.
    let (severity, code, message) = login_error(server.pg, "query-token-012345678X");
    assert_eq!(
        (severity.as_str(), code.as_str()),
        ("FATAL", "28P01"),
        "{message}"
    );

    let ingest = server.psql(
        Some("ingest-token-0123456789"),
        "disable",
        &["-c", "SELECT 7"],
    );
    assert!(!ingest.ok);
    assert!(ingest.stderr.contains("query scope"), "{}", ingest.stderr);
    let (_, code, message) = login_error(server.pg, "ingest-token-0123456789");
    assert_eq!(code, "28000", "{message}");

    let none = server.psql(None, "disable", &["-c", "SELECT 7"]);
    assert!(!none.ok, "no password must not log in: {}", none.stdout);
}

/// Logs in over a raw socket with a cleartext password that must be refused; returns the
/// severity, SQLSTATE and message of the server's ErrorResponse.
fn login_error(addr: std::net::SocketAddr, password: &str) -> (String, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    let mut body = 196_608_i32.to_be_bytes().to_vec();
    body.extend_from_slice(b"user\0grafana\0database\0gpuwatch\0\0");
    let mut msg = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    msg.extend_from_slice(&body);
    s.write_all(&msg).expect("startup");
    let read_msg = |s: &mut std::net::TcpStream| -> (u8, Vec<u8>) {
        let mut head = [0u8; 5];
        s.read_exact(&mut head).expect("message header");
        let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut rest = vec![0u8; len - 4];
        s.read_exact(&mut rest).expect("message body");
        (head[0], rest)
    };
    let (kind, rest) = read_msg(&mut s);
    assert_eq!(kind, b'R', "expected an authentication request");
    assert_eq!(
        &rest[..4],
        &3_i32.to_be_bytes(),
        "expected a cleartext password request"
    );
    let mut pw = password.as_bytes().to_vec();
    pw.push(0);
    let mut msg = vec![b'p'];
    msg.extend_from_slice(&((pw.len() + 4) as i32).to_be_bytes());
    msg.extend_from_slice(&pw);
    s.write_all(&msg).expect("password");
    let (kind, rest) = read_msg(&mut s);
    assert_eq!(kind, b'E', "expected an error response");
    let (mut severity, mut code, mut message) = (String::new(), String::new(), String::new());
    for field in rest.split(|b| *b == 0).filter(|f| !f.is_empty()) {
        let text = String::from_utf8_lossy(&field[1..]).into_owned();
        match field[0] {
            b'S' => severity = text,
            b'C' => code = text,
            b'M' => message = text,
            _ => {}
        }
    }
    (severity, code, message)
}

/// One case of tests/fixtures/grafana_postgres_macros.sql.
#[derive(Debug)]
struct Case {
    name: String,
    expect: Vec<String>,
    sql: String,
}

fn cases() -> Vec<Case> {
    let text = include_str!("../fixtures/grafana_postgres_macros.sql");
    let mut out = Vec::new();
    let mut current: Option<Case> = None;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("-- case: ") {
            current = Some(Case {
                name: name.trim().to_string(),
                expect: Vec::new(),
                sql: String::new(),
            });
        } else if let Some(kind) = line.strip_prefix("-- expect: ") {
            if let Some(c) = current.as_mut() {
                c.expect = kind.split_whitespace().map(str::to_string).collect();
            }
        } else if line.trim() == ";" {
            if let Some(c) = current.take() {
                out.push(c);
            }
        } else if line.starts_with("--") {
            continue;
        } else if let Some(c) = current.as_mut() {
            c.sql.push_str(line);
            c.sql.push('\n');
        }
    }
    out
}

/// Sample times (unix seconds) and utilisations within `[from, to]`.
fn in_range(from: f64, to: f64) -> Vec<(i64, f64)> {
    (0..SAMPLES)
        .map(|i| (FIRST + i * 60, util(i)))
        .filter(|(t, _)| *t as f64 >= from && *t as f64 <= to)
        .collect()
}

/// psql's text for a timestamp at unix second `t` (UTC).
fn timestamp_text(t: i64) -> String {
    let secs = t - FIRST + 11 * 3600 + 50 * 60;
    format!(
        "2025-06-01 {:02}:{:02}:{:02}.000000+00",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[tokio::test(flavor = "multi_thread")]
async fn grafana_macro_sql_answers_time_series() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), &[]);
    load(&server).await;

    let cases = cases();
    assert!(cases.len() >= 10, "fixtures not parsed: {cases:?}");
    for case in &cases {
        // Column names on, to check the `time` column is there and first.
        let out = server.psql(None, "disable", &["-A", "-F", "|", "-c", &case.sql]);
        let out = if out.ok {
            out
        } else {
            panic!("case {}: psql failed: {}", case.name, out.stderr)
        };
        let rows: Vec<Vec<&str>> = out.stdout.lines().map(|l| l.split('|').collect()).collect();
        let num = |s: &str| -> f64 {
            s.parse()
                .unwrap_or_else(|_| panic!("case {}: not a number: {s:?}", case.name))
        };
        let (from, to) = (num(&case.expect[1]), num(&case.expect[2]));
        match case.expect[0].as_str() {
            "raw" | "raw_epoch" => {
                let want = in_range(from, to);
                assert_eq!(rows.len(), want.len(), "case {}: {}", case.name, out.stdout);
                for (row, (t, u)) in rows.iter().zip(&want) {
                    if case.expect[0] == "raw" {
                        assert_eq!(row[0], timestamp_text(*t), "case {}", case.name);
                    } else {
                        assert!(close(num(row[0]), *t as f64), "case {}: {row:?}", case.name);
                    }
                    assert!(
                        close(num(row[row.len() - 1]), *u),
                        "case {}: {row:?}",
                        case.name
                    );
                }
            }
            "buckets" => {
                let step = num(&case.expect[3]) as i64;
                let mut want: Vec<(i64, Vec<f64>)> = Vec::new();
                for (t, u) in in_range(from, to) {
                    let b = t.div_euclid(step) * step;
                    match want.last_mut() {
                        Some((last, vals)) if *last == b => vals.push(u),
                        _ => want.push((b, vec![u])),
                    }
                }
                assert_eq!(rows.len(), want.len(), "case {}: {}", case.name, out.stdout);
                for (row, (b, vals)) in rows.iter().zip(&want) {
                    let avg = vals.iter().sum::<f64>() / vals.len() as f64;
                    assert!(
                        close(num(row[0]), *b as f64),
                        "case {}: {row:?} vs {b}",
                        case.name
                    );
                    assert!(
                        close(num(row[row.len() - 1]), avg),
                        "case {}: {row:?} vs {avg}",
                        case.name
                    );
                }
            }
            other => panic!("case {}: unknown expectation {other}", case.name),
        }
        // Sorted by time, as Grafana needs.
        let times: Vec<String> = rows.iter().map(|r| r[0].to_string()).collect();
        let mut sorted = times.clone();
        sorted.sort_by(|a, b| match (a.parse::<f64>(), b.parse::<f64>()) {
            (Ok(x), Ok(y)) => x.total_cmp(&y),
            _ => a.cmp(b),
        });
        assert_eq!(times, sorted, "case {}: not sorted by time", case.name);
    }
}

/// buildSchemaConstraint() of Grafana's postgresMetaQuery.ts: the schemas of the search path,
/// found through set-returning functions in `FROM`.
const GRAFANA_SCHEMA_CONSTRAINT: &str = r#"
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

/// showTables() of Grafana's postgresMetaQuery.ts (the query builder's table list).
fn grafana_show_tables() -> String {
    let c = GRAFANA_SCHEMA_CONSTRAINT;
    format!(
        r#"SELECT
    CASE WHEN {c}
      THEN quote_ident(table_name)
      ELSE quote_ident(table_schema) || '.' || quote_ident(table_name)
    END AS "table"
    FROM information_schema.tables
    WHERE quote_ident(table_schema) NOT IN ('information_schema',
                             'pg_catalog',
                             '_timescaledb_cache',
                             '_timescaledb_catalog',
                             '_timescaledb_internal',
                             '_timescaledb_config',
                             'timescaledb_information',
                             'timescaledb_experimental')
    ORDER BY CASE WHEN {c} THEN 0 ELSE 1 END, 1
"#
    )
}

/// getSchema(table) of Grafana's postgresMetaQuery.ts (the query builder's column list), for
/// the table name the builder picked.
fn grafana_get_schema(table: &str) -> String {
    let table = format!("'{}'", table.replace('\'', "''"));
    let c = GRAFANA_SCHEMA_CONSTRAINT;
    format!(
        r#"SELECT quote_ident(column_name) AS "column", data_type AS "type"
    FROM information_schema.columns
    WHERE
      CASE WHEN array_length(parse_ident({table}),1) = 2
        THEN quote_ident(table_schema) = (parse_ident({table}))[1]
          AND quote_ident(table_name) = (parse_ident({table}))[2]
        ELSE quote_ident(table_name) = {table}
          AND {c}
      END"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn grafana_connection_test_and_editor_queries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), &[]);
    // The health check pings (pgx sends a comment-only statement).
    let ping = server.psql(None, "disable", &["-c", "-- ping"]);
    assert!(ping.ok, "{}", ping.stderr);
    // The data source settings page asks for the version
    // (public/app/plugins/datasource/grafana-postgresql-datasource/postgresMetaQuery.ts).
    let version = ok(
        &server,
        "SELECT current_setting('server_version_num')::int/100 as version",
    );
    let v: i64 = version.trim().parse().expect("a number");
    assert!(v >= 1200, "grafana needs a version >= 12: {v}");
    // The query builder's table list, as Grafana writes it (showTables() without a schema).
    let out = server.psql(None, "disable", &["-c", &grafana_show_tables()]);
    assert!(out.ok, "{}", out.stderr);
    // Tables of the search path come unqualified, first.
    let listed: Vec<&str> = out.stdout.lines().collect();
    assert!(listed.contains(&"gpu_metrics"), "{}", out.stdout);
    assert!(
        !listed.iter().any(|l| l.starts_with("public.")),
        "{}",
        out.stdout
    );
    // The builder's column list for the picked table, unqualified and qualified.
    for table in ["gpu_metrics", "public.gpu_metrics"] {
        let columns = ok(&server, &grafana_get_schema(table));
        let names: Vec<&str> = columns
            .lines()
            .filter_map(|l| l.split('|').next())
            .collect();
        for column in [
            "time",
            "host",
            "gpu_uuid",
            "job_id",
            "gpu_utilization",
            "energy_joules",
        ] {
            assert!(
                names.contains(&column),
                "{table}: {column} missing in {columns}"
            );
        }
        // Postgres type names, as a Postgres server gives them: the builder offers `time` as
        // the time column and aggregations over the values.
        for (column, pg_type) in [
            ("time", "timestamp with time zone"),
            ("gpu_utilization", "double precision"),
            ("energy_joules", "double precision"),
            ("host", "text"),
        ] {
            assert!(
                columns.lines().any(|l| l == format!("{column}|{pg_type}")),
                "{table}: {column} is not {pg_type}: {columns}"
            );
        }
        assert!(
            !names.contains(&"metric"),
            "{table}: columns of other tables: {columns}"
        );
    }
    // The query builder lists tables of the search path.
    let tables = ok(
        &server,
        "SELECT quote_ident(table_name) AS \"table\" FROM information_schema.tables WHERE quote_ident(table_schema) = 'public' ORDER BY 1",
    );
    assert!(tables.lines().any(|l| l == "gpu_metrics"), "{tables}");
    let columns = ok(
        &server,
        "SELECT quote_ident(column_name) AS \"column\", data_type AS \"type\" FROM information_schema.columns WHERE quote_ident(table_name) = 'gpu_metrics' AND quote_ident(table_schema) = 'public'",
    );
    assert!(
        columns
            .lines()
            .any(|l| l == "gpu_utilization|double precision"),
        "{columns}"
    );
    // Every type has a Postgres name; map columns are USER-DEFINED, as extension types are.
    let types = ok(
        &server,
        "SELECT DISTINCT data_type FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1",
    );
    for t in types.lines() {
        assert!(
            [
                "bigint",
                "double precision",
                "integer",
                "smallint",
                "text",
                "timestamp with time zone",
                "USER-DEFINED"
            ]
            .contains(&t),
            "{t} in {types}"
        );
    }
    let labels = ok(
        &server,
        "SELECT data_type FROM information_schema.columns WHERE table_name = 'metrics' AND column_name = 'labels'",
    );
    assert_eq!(labels.trim(), "USER-DEFINED");
}

/// The extended protocol with binary results and typed parameters, as Grafana's pgx driver
/// uses it, from another real client: psycopg 3 (`binary=True`, server-side prepared).
const PSYCOPG: &str = r#"
import sys, datetime, psycopg
utc = datetime.timezone.utc
with psycopg.connect(sys.argv[1]) as conn:
    cur = conn.cursor(binary=True)
    cur.execute(
        'SELECT floor(extract(epoch from time)/300)*300 AS "time", avg(gpu_utilization) AS value, '
        'count(*) AS n, max(time) AS last, min(host) AS host FROM gpu_metrics '
        'WHERE time BETWEEN %s AND %s GROUP BY 1 ORDER BY 1',
        (datetime.datetime(2025, 6, 1, 12, 0, tzinfo=utc), datetime.datetime(2025, 6, 1, 13, 0, tzinfo=utc)),
        prepare=True,
    )
    print([d.name for d in cur.description])
    for t, value, n, last, host in cur.fetchall():
        print(f"{t!r}|{value!r}|{n}|{last.astimezone(utc).isoformat()}|{host}")
    try:
        cur.execute("DROP TABLE gpu_metrics", prepare=True)
    except psycopg.Error as e:
        print("refused", e.sqlstate)
"#;

#[tokio::test(flavor = "multi_thread")]
async fn extended_protocol_with_binary_results() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), &[]);
    load(&server).await;
    let text = psycopg(&server, PSYCOPG, &[]);
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("['time', 'value', 'n', 'last', 'host']"),
        "{text}"
    );
    let rows: Vec<&str> = lines
        .clone()
        .take_while(|l| !l.starts_with("refused"))
        .collect();
    let want: Vec<(i64, Vec<i64>)> = {
        let mut v: Vec<(i64, Vec<i64>)> = Vec::new();
        for i in 0..SAMPLES {
            let t = FIRST + i * 60;
            if !(1_748_779_200..=1_748_782_800).contains(&t) {
                continue;
            }
            let b = t / 300 * 300;
            match v.last_mut() {
                Some((last, is)) if *last == b => is.push(i),
                _ => v.push((b, vec![i])),
            }
        }
        v
    };
    assert_eq!(rows.len(), want.len(), "{text}");
    for (row, (b, is)) in rows.iter().zip(&want) {
        let f: Vec<&str> = row.split('|').collect();
        assert_eq!(f[0].parse::<f64>().expect("time"), *b as f64, "{row}");
        let avg = is.iter().map(|i| util(*i)).sum::<f64>() / is.len() as f64;
        assert!(close(f[1].parse().expect("value"), avg), "{row}");
        assert_eq!(f[2], is.len().to_string(), "{row}");
        let last = FIRST + is[is.len() - 1] * 60;
        assert_eq!(
            f[3],
            timestamp_text(last)
                .replacen(' ', "T", 1)
                .replace(".000000+00", "+00:00"),
            "{row}"
        );
        assert_eq!(f[4], "node-1", "{row}");
    }
    assert_eq!(text.lines().last(), Some("refused 42501"), "{text}");
}

/// Runs the Python `script` (psycopg 3) with the server's DSN and `args` as its arguments, and
/// gives its standard output; fails the test if it fails.
fn psycopg(server: &TestServer, script: &str, args: &[&str]) -> String {
    let dsn = format!(
        "host={} port={} user=grafana dbname=gpuwatch sslmode=disable",
        server.pg.ip(),
        server.pg.port()
    );
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&dsn)
        .args(args)
        .output()
        .expect("python3 (bash .ci/run installs psycopg)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "psycopg failed (pip install 'psycopg[binary]', as .ci/run does): {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}
