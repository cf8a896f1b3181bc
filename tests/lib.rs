//! Support for the end-to-end tests in `e2e/`: start the real `gpuwatch` and `gpuwatch-agent`
//! binaries on free ports and a temporary directory, and talk to them over HTTP.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The directory holding the workspace's built binaries (`target/debug`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/debug/deps/e2e-<hash> → target/debug
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf();
    for name in ["gpuwatch", "gpuwatch-agent"] {
        assert!(
            dir.join(name).exists(),
            "{} is missing: run the tests with `cargo test --workspace` so the binaries are built",
            dir.join(name).display()
        );
    }
    dir
}

/// A free loopback port (bound and released; good enough for tests).
///
/// Ports are handed out from 20000–31999, below Linux's ephemeral range (32768 and up), so that
/// the source port of some client's connection never takes a port a test is about to bind; a
/// process-wide counter keeps the tests of one run from picking the same port twice.
pub fn free_addr() -> SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7919) % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = LOW + (start + n) % SPAN;
        let addr = SocketAddr::from(([127, 0, 0, 1], port as u16));
        if TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
    panic!("no free port in 20000-31999")
}

/// A running `gpuwatch serve` on free ports.
#[derive(Debug)]
pub struct TestServer {
    child: Option<Child>,
    /// Main HTTP address.
    pub http: SocketAddr,
    /// OTLP/HTTP address.
    pub otlp: SocketAddr,
    /// OTLP/gRPC address.
    pub grpc: SocketAddr,
    /// PostgreSQL wire protocol address.
    pub pg: SocketAddr,
    /// Data directory.
    pub data_dir: PathBuf,
    extra: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    /// With TLS: the certificate clients trust.
    pub ca: Option<PathBuf>,
    /// The open-file limit the server runs under (`ulimit -n`), if set.
    nofile: Option<u64>,
}

/// Builds a [`TestServer`].
#[derive(Debug, Default)]
pub struct TestServerBuilder {
    data_dir: Option<PathBuf>,
    tls: Option<(PathBuf, PathBuf)>,
    extra: Vec<String>,
    env: Vec<(String, String)>,
    nofile: Option<u64>,
}

impl TestServerBuilder {
    /// Runs the server under `ulimit -n n` (its soft open-file limit).
    pub fn nofile(mut self, n: u64) -> Self {
        self.nofile = Some(n);
        self
    }

    /// Uses this data directory.
    pub fn data_dir(mut self, dir: &Path) -> Self {
        self.data_dir = Some(dir.to_path_buf());
        self
    }

    /// Serves TLS with this PEM certificate (also the CA clients trust) and key.
    pub fn tls(mut self, cert: &Path, key: &Path) -> Self {
        self.tls = Some((cert.to_path_buf(), key.to_path_buf()));
        self
    }

    /// Adds a flag.
    pub fn arg(mut self, a: &str) -> Self {
        self.extra.push(a.to_string());
        self
    }

    /// Keeps the files in `s3` under `prefix` (`--object-store`, and the AWS variables).
    pub fn object_store(mut self, s3: &S3Server, prefix: &str) -> Self {
        self.extra.push("--object-store".into());
        self.extra.push(s3.url(prefix));
        self.env.extend(s3.env());
        self
    }

    /// Sets an environment variable of the server.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Starts the server without waiting for it to be ready (a server that cannot open its
    /// store yet); [`TestServer::wait_until_ready`] waits.
    pub fn spawn(self) -> TestServer {
        let data_dir = self.data_dir.expect("data dir");
        let mut s = TestServer {
            child: None,
            http: free_addr(),
            otlp: free_addr(),
            grpc: free_addr(),
            pg: free_addr(),
            log: data_dir.with_extension("log"),
            data_dir,
            extra: self.extra,
            env: self.env,
            ca: None,
            nofile: self.nofile,
        };
        s.launch();
        s
    }

    /// Starts the server and waits until it is ready.
    pub fn start(self) -> TestServer {
        let data_dir = self.data_dir.expect("data dir");
        let mut s = TestServer {
            child: None,
            http: free_addr(),
            otlp: free_addr(),
            grpc: free_addr(),
            pg: free_addr(),
            log: data_dir.with_extension("log"),
            data_dir,
            extra: self.extra,
            env: self.env,
            ca: None,
            nofile: self.nofile,
        };
        if let Some((cert, key)) = self.tls {
            s.extra.extend([
                "--tls-cert".to_string(),
                cert.display().to_string(),
                "--tls-key".to_string(),
                key.display().to_string(),
            ]);
            s.ca = Some(cert);
        }
        // A port picked by `free_addr` can be taken by another test before the server binds it:
        // on that (and only that) failure, pick new ports and start again.
        for _ in 0..5 {
            match s.try_spawn() {
                Ok(()) => return s,
                Err(log) if log.contains("Address already in use") => {
                    s.http = free_addr();
                    s.otlp = free_addr();
                    s.grpc = free_addr();
                    s.pg = free_addr();
                }
                Err(log) => panic!("gpuwatch serve did not start; log:\n{log}"),
            }
        }
        panic!(
            "gpuwatch serve found no free ports in 5 tries; log:\n{}",
            s.log_text()
        );
    }
}

impl TestServer {
    /// A builder.
    pub fn builder() -> TestServerBuilder {
        TestServerBuilder::default()
    }

    fn spawn(&mut self) {
        if let Err(log) = self.try_spawn() {
            panic!("gpuwatch serve did not start; log:\n{log}");
        }
    }

    /// Waits until `/readyz` answers 200, at most `limit`; panics with the log otherwise.
    pub fn wait_until_ready(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if http_get(self.http, "/readyz").is_ok_and(|(code, _)| code == 200) {
                return;
            }
            assert!(self.alive(), "the server exited:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("not ready within {limit:?}:\n{}", self.log_text());
    }

    /// Starts the server; on failure returns its log.
    fn try_spawn(&mut self) -> Result<(), String> {
        self.launch();
        self.wait_ready()
    }

    /// Starts the process.
    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let bin = bin_dir().join("gpuwatch");
        let mut cmd = match self.nofile {
            None => Command::new(&bin),
            Some(n) => {
                let mut c = Command::new("bash");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(&bin);
                c
            }
        };
        let child = cmd
            .arg("serve")
            .arg("--http-addr")
            .arg(self.http.to_string())
            .arg("--otlp-http-addr")
            .arg(self.otlp.to_string())
            .arg("--otlp-grpc-addr")
            .arg(self.grpc.to_string())
            .arg("--pg-addr")
            .arg(self.pg.to_string())
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(&self.extra)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("GPUWATCH_LOG_LEVEL", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start gpuwatch serve");
        self.child = Some(child);
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!("exited early ({status}):\n{}", self.log_text()));
            }
            let ready = match &self.ca {
                None => http_get(self.http, "/readyz")
                    .map(|(code, _)| code == 200)
                    .unwrap_or(false),
                Some(ca) => Command::new("curl")
                    .args(["-sf", "--max-time", "2", "--cacert"])
                    .arg(ca)
                    .arg(format!("https://{}/readyz", self.http))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .map(|s| s.success())
                    .unwrap_or(false),
            };
            if ready {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("not ready within 30 s:\n{}", self.log_text()))
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn scheme(&self) -> &'static str {
        if self.ca.is_some() { "https" } else { "http" }
    }

    /// Base URL of the main listener.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme(), self.http)
    }

    /// Base URL of the OTLP/HTTP listener.
    pub fn otlp_url(&self) -> String {
        format!("{}://{}", self.scheme(), self.otlp)
    }

    /// Kills the server with SIGKILL (no chance to flush anything).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the server with SIGTERM and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if c.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same ports and data directory.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// What `psql` printed and how it exited.
#[derive(Debug)]
pub struct PsqlOutput {
    /// True when psql exited 0.
    pub ok: bool,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl TestServer {
    /// Runs the real `psql` against the Postgres listener: `-X -At` (no psqlrc, unaligned,
    /// tuples only), `ON_ERROR_STOP`, verbose errors (with SQLSTATE), then `args`.
    /// `password` goes in `PGPASSWORD`; `sslmode` is `disable`, `require`, ….
    pub fn psql(&self, password: Option<&str>, sslmode: &str, args: &[&str]) -> PsqlOutput {
        let conninfo = format!(
            "host={} port={} user=grafana dbname=gpuwatch sslmode={sslmode} connect_timeout=10",
            self.pg.ip(),
            self.pg.port()
        );
        let mut cmd = Command::new("psql");
        cmd.arg(conninfo)
            .args([
                "-X",
                "-w",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-v",
                "VERBOSITY=verbose",
            ])
            .args(args)
            .env_remove("PGPASSWORD")
            .env("PGCONNECT_TIMEOUT", "10")
            .stdin(Stdio::null());
        if let Some(p) = password {
            cmd.env("PGPASSWORD", p);
        }
        let out = cmd.output().expect("run psql (package postgresql-client)");
        PsqlOutput {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// A running `gpuwatch-agent`.
#[derive(Debug)]
pub struct TestAgent {
    child: Child,
}

impl TestAgent {
    /// Starts the agent with these arguments.
    pub fn start(args: &[&str]) -> Self {
        let child = Command::new(bin_dir().join("gpuwatch-agent"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start gpuwatch-agent");
        Self { child }
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of an unlabelled sample `name` on the Prometheus exposition at `addr`/metrics, or
/// `None` when it cannot be read.
pub fn metric(addr: SocketAddr, name: &str) -> Option<f64> {
    let (_, body) = http_get(addr, "/metrics").ok()?;
    body.lines()
        .find(|l| l.starts_with(&format!("{name} ")))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

/// A tiny blocking HTTP/1.0 GET (used before any async runtime is involved).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http_call(addr, "GET", path)
}

/// A tiny blocking HTTP/1.0 request with an empty body.
pub fn http_call(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    let code = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// A real S3 server (moto, `pip install 'moto[server]'`) on a free port, with one bucket; killed
/// on drop.
#[derive(Debug)]
pub struct S3Server {
    child: Option<Child>,
    /// Its address.
    pub addr: SocketAddr,
    /// The bucket the tests use.
    pub bucket: String,
}

impl S3Server {
    /// Starts `moto_server` and creates the bucket.
    pub fn start() -> Self {
        let addr = free_addr();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &addr.port().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server (install it: pip install 'moto[server]')");
        let mut s = Self {
            child: Some(child),
            addr,
            bucket: "gpuwatch-e2e".into(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = s.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("moto_server exited early ({status})");
            }
            if let Ok((code, _)) = http_call(addr, "PUT", &format!("/{}", s.bucket)) {
                assert_eq!(code, 200, "create bucket");
                return s;
            }
            assert!(Instant::now() < deadline, "moto_server not up within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `s3://bucket/prefix`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.bucket)
    }

    /// The AWS variables a server needs to reach it.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", format!("http://{}", self.addr)),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Puts an object (`key` under the bucket) through the S3 API.
    pub fn put(&self, key: &str, bytes: &[u8]) {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect_timeout(&self.addr, Duration::from_secs(2))
            .expect("connect to moto");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        write!(
            s,
            "PUT /{}/{key} HTTP/1.0\r\nHost: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.bucket,
            self.addr,
            bytes.len()
        )
        .expect("write head");
        s.write_all(bytes).expect("write body");
        let mut buf = String::new();
        s.read_to_string(&mut buf).expect("read answer");
        assert!(
            buf.starts_with("HTTP/1.0 200") || buf.starts_with("HTTP/1.1 200"),
            "put {key}: {buf}"
        );
    }

    /// The keys under `prefix`, listed through the S3 API.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let (code, body) = http_call(
            self.addr,
            "GET",
            &format!(
                "/{}?list-type=2&max-keys=100000&prefix={prefix}",
                self.bucket
            ),
        )
        .expect("list objects");
        assert_eq!(code, 200, "{body}");
        body.split("<Key>")
            .skip(1)
            .filter_map(|k| k.split_once("</Key>").map(|(k, _)| k.to_string()))
            .collect()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
