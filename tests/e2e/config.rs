//! Flag > environment > config file > default, as a user would set them.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuwatch_e2e::{bin_dir, free_addr, http_get};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_ready(addr: std::net::SocketAddr) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if http_get(addr, "/readyz")
            .map(|(c, _)| c == 200)
            .unwrap_or(false)
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn flag_beats_env_beats_file_beats_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (file_addr, env_addr, flag_addr, otlp, grpc) = (
        free_addr(),
        free_addr(),
        free_addr(),
        free_addr(),
        free_addr(),
    );
    let data = dir.path().join("from-file");
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &config,
        format!(
            "http_addr = \"{file_addr}\"\notlp_http_addr = \"{otlp}\"\notlp_grpc_addr = \"{grpc}\"\npg_addr = \"off\"\ndata_dir = \"{}\"\n",
            data.display()
        ),
    )
    .expect("config");
    let start = |env: Option<std::net::SocketAddr>, flag: Option<std::net::SocketAddr>| {
        let mut cmd = Command::new(bin_dir().join("gpuwatch"));
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd.env_remove("GPUWATCH_HTTP_ADDR");
        if let Some(e) = env {
            cmd.env("GPUWATCH_HTTP_ADDR", e.to_string());
        }
        if let Some(f) = flag {
            cmd.arg("--http-addr").arg(f.to_string());
        }
        Killed(cmd.spawn().expect("start gpuwatch"))
    };
    {
        let _s = start(None, None);
        assert!(wait_ready(file_addr), "the file's http_addr is used");
        assert!(
            data.join("writer-id").exists() || data.join("wal").exists(),
            "the file's data_dir is used"
        );
    }
    {
        let _s = start(Some(env_addr), None);
        assert!(wait_ready(env_addr), "the environment beats the file");
    }
    {
        let _s = start(Some(env_addr), Some(flag_addr));
        assert!(wait_ready(flag_addr), "the flag beats the environment");
    }
}

#[test]
fn bad_config_and_unsafe_binds_are_refused_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "htp_addr = \"127.0.0.1:1\"\n").expect("config");
    let out = Command::new(bin_dir().join("gpuwatch"))
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("htp_addr"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = Command::new(bin_dir().join("gpuwatch"))
        .args(["serve", "--http-addr", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path().join("d"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--insecure-no-auth"), "{err}");
}
