//! Starting and measuring the servers under test: gpuwatch, VictoriaMetrics, Prometheus.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A result with a message that says what went wrong.
pub(crate) type Result<T, E = String> = std::result::Result<T, E>;

/// A server process the benchmark started; stopped (by its pid) when dropped.
pub(crate) struct Server {
    /// Display name.
    pub name: String,
    /// Base URL, `http://127.0.0.1:PORT`.
    pub url: String,
    child: Child,
    log: PathBuf,
}

impl Server {
    /// Starts `program args…` with its output in `log`, then waits until `ready_path` answers 200.
    pub(crate) fn start(
        name: &str,
        program: &Path,
        args: &[String],
        url: String,
        ready_path: &str,
        log: PathBuf,
    ) -> Result<Self> {
        let out = fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start {name} ({}): {e}; install it or pass its path",
                    program.display()
                )
            })?;
        let mut server = Self {
            name: name.to_string(),
            url,
            child,
            log,
        };
        server.wait_ready(ready_path, Duration::from_secs(120))?;
        Ok(server)
    }

    fn wait_ready(&mut self, path: &str, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        let url = format!("{}{path}", self.url);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "{} exited with {status} before it was ready; see {}",
                    self.name,
                    self.log.display()
                ));
            }
            if blocking_get(&url).map(|(s, _)| s == 200).unwrap_or(false) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} not ready after {limit:?} at {url}; see {}",
                    self.name,
                    self.log.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU time (user + system) the process used so far, from `/proc/<pid>/stat`.
    pub(crate) fn cpu_seconds(&self) -> Result<f64> {
        cpu_seconds(self.pid())
    }

    /// Resident memory in bytes, from `/proc/<pid>/status` (`VmRSS`).
    pub(crate) fn rss_bytes(&self) -> Option<u64> {
        let s = fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }

    /// Asks the process to stop (SIGTERM to its pid, through `kill`), so that it shuts down as
    /// an operator would stop it (gpuwatch persists what it buffers), and waits up to `timeout`;
    /// kills it after that and says so.
    pub(crate) fn terminate(&mut self, timeout: Duration) -> Result<()> {
        if let Ok(Some(_)) = self.child.try_wait() {
            return Ok(());
        }
        let sent = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .map_err(|e| format!("cannot run kill: {e}"))?;
        if !sent.success() {
            return Err(format!("kill -TERM {} failed: {sent}", self.pid()));
        }
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.stop();
        Err(format!(
            "{} did not stop within {timeout:?} of SIGTERM and was killed; see {}",
            self.name,
            self.log.display()
        ))
    }

    /// Stops the process (SIGKILL through `Child::kill`) and reaps it.
    pub(crate) fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Ticks per second of `/proc` times (`getconf CLK_TCK`; 100 on Linux when it cannot be asked).
fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// CPU time (utime + stime) of `pid` in seconds.
pub(crate) fn cpu_seconds(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| format!("{path}: unexpected format"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state); utime is field 14, stime field 15.
    let parse = |i: usize| -> Result<f64> {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("{path}: no field {}", i + 3))
    };
    Ok((parse(11)? + parse(12)?) / clock_ticks())
}

/// Persist every 30 s and compact every 5 s: a benchmark's data settles in seconds, not in the
/// production defaults' minutes.
pub(crate) const FAST_PERSIST: [&str; 4] =
    ["--persist-interval", "30s", "--compaction-interval", "5s"];

/// A `gpuwatch serve` command line: every listener on its own free loopback port, a data
/// directory and warnings-only logs (and the jobs ledger's folds); flags added with [`GpuwatchCmd::args`].
pub(crate) struct GpuwatchCmd {
    args: Vec<String>,
    /// HTTP port (SQL, `/readyz`, remote write).
    pub http: u16,
    /// OTLP/HTTP port.
    pub otlp_http: u16,
    /// Postgres wire port.
    pub pg: u16,
}

impl GpuwatchCmd {
    /// `gpuwatch serve --data-dir data_dir` with fresh ports.
    pub(crate) fn new(data_dir: &Path) -> Result<Self> {
        let (http, otlp_http, pg) = (free_port()?, free_port()?, free_port()?);
        let args = [
            "serve".to_string(),
            "--http-addr".into(),
            format!("127.0.0.1:{http}"),
            "--otlp-http-addr".into(),
            format!("127.0.0.1:{otlp_http}"),
            "--otlp-grpc-addr".into(),
            format!("127.0.0.1:{}", free_port()?),
            "--pg-addr".into(),
            format!("127.0.0.1:{pg}"),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--log-level".into(),
            // Warnings, and the jobs ledger's folds (how many hours, how long).
            "warn,gpuwatch_alerts::cost::ledger=info".into(),
        ]
        .into();
        Ok(Self {
            args,
            http,
            otlp_http,
            pg,
        })
    }

    /// Adds flags.
    pub(crate) fn args<S: ToString>(mut self, more: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(more.into_iter().map(|a| a.to_string()));
        self
    }

    /// Starts `program` with these arguments, output in `log`, and waits for `/readyz`.
    pub(crate) fn start(&self, name: &str, program: &Path, log: PathBuf) -> Result<Server> {
        Server::start(
            name,
            program,
            &self.args,
            format!("http://127.0.0.1:{}", self.http),
            "/readyz",
            log,
        )
    }
}

/// The directory that holds `data_dir` (and the benchmark's logs and config beside it),
/// created if missing.
pub(crate) fn parent_dir(data_dir: &Path) -> Result<PathBuf> {
    let parent = data_dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    fs::create_dir_all(&parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    Ok(parent)
}

/// A free TCP port on 127.0.0.1 (bound and released; the server binds it right after).
pub(crate) fn free_port() -> Result<u16> {
    let l =
        TcpListener::bind("127.0.0.1:0").map_err(|e| format!("cannot find a free port: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free port: {e}"))
}

/// Bytes of the regular files under `dir`, skipping subdirectories named in `skip`.
pub(crate) fn dir_bytes(dir: &Path, skip: &[&str]) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                let name = e.file_name();
                if d == dir && skip.iter().any(|s| name == *s) {
                    continue;
                }
                stack.push(e.path());
            } else if meta.is_file() {
                total += meta.len();
            }
        }
    }
    total
}

/// A plain GET (std only, HTTP/1.0 style) returning status and body: used for readiness and
/// admin calls, outside the measured paths.
pub(crate) fn blocking_get(url: &str) -> Result<(u16, String)> {
    blocking_request("GET", url, "")
}

/// A plain POST with an empty body.
pub(crate) fn blocking_post(url: &str) -> Result<(u16, String)> {
    blocking_request("POST", url, "")
}

fn blocking_request(method: &str, url: &str, body: &str) -> Result<(u16, String)> {
    use std::io::{Read, Write};
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: only http:// urls"))?;
    let (addr, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| format!("{url}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(600)))
        .map_err(|e| format!("{url}: {e}"))?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .map_err(|e| format!("{url}: {e}"))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| format!("{url}: {e}"))?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("{url}: no HTTP status in the answer"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// The value of the first line of a Prometheus exposition that starts with `prefix`, summed
/// over every line that does.
pub(crate) fn metric_sum(exposition: &str, prefix: &str) -> Option<f64> {
    let mut found = false;
    let mut sum = 0.0;
    for line in exposition.lines() {
        if line.starts_with('#') || !line.starts_with(prefix) {
            continue;
        }
        let rest = &line[prefix.len()..];
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        if let Some(v) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            sum += v;
            found = true;
        }
    }
    found.then_some(sum)
}

/// The first line of `program --version` (or `-version`), for the report; the Debian package
/// version when the binary prints none.
pub(crate) fn version_of(program: &Path, flag: &str) -> String {
    let printed = Command::new(program)
        .arg(flag)
        .output()
        .ok()
        .map(|o| {
            let mut s = String::from_utf8_lossy(&o.stdout).to_string();
            s.push_str(&String::from_utf8_lossy(&o.stderr));
            s.lines().next().unwrap_or("").trim().to_string()
        })
        .unwrap_or_default();
    if !printed.is_empty() {
        return printed;
    }
    let package = program
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", &package])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            format!(
                "{package} {} (Debian package)",
                String::from_utf8_lossy(&o.stdout).trim()
            )
        })
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_time_is_readable() {
        let t = cpu_seconds(std::process::id()).expect("cpu time");
        assert!(t >= 0.0);
    }

    #[test]
    fn metric_sum_adds_labelled_lines_only_of_that_name() {
        let text = "# HELP x\nx_total{a=\"1\"} 2\nx_total{a=\"2\"} 3\nx_total_other 9\n";
        assert_eq!(metric_sum(text, "x_total"), Some(5.0));
        assert_eq!(metric_sum(text, "y"), None);
    }
}
