//! Test support shared by this crate's tests and the query engine's (feature `testing`).

use std::sync::OnceLock;

/// Starts moto in-process in Python, makes the `gpuwatch-test` bucket, prints the port, and
/// stops once its parent (the test process) is gone.
const MOTO: &str = r#"
import logging, os, time, urllib.request
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.ERROR)
parent = os.getppid()
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/gpuwatch-test", method="PUT")).read()
print(port, flush=True)
while os.getppid() == parent:
    time.sleep(0.2)
server.stop()
"#;

/// The endpoint of an S3 server (moto) shared by the tests of this process, with one bucket,
/// `gpuwatch-test`; it stops when this process exits. Panics with the install command when
/// moto is missing.
pub fn moto_endpoint() -> &'static str {
    static ENDPOINT: OnceLock<String> = OnceLock::new();
    ENDPOINT.get_or_init(|| {
        use std::io::BufRead;
        let mut child = std::process::Command::new("python3")
            .args(["-c", MOTO])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 to start the S3 server");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the S3 server's port");
        let port: u16 = line.trim().parse().unwrap_or_else(|_| {
            panic!("the S3 server did not start (install it: pip install 'moto[server]'): {line:?}")
        });
        // Not waited for: the child exits by itself once this process is gone.
        drop(child);
        format!("http://127.0.0.1:{port}")
    })
}
