# An OTLP/HTTP endpoint for measurements: answers every POST with 200 and keeps the connection
# open, as the real server does. Port: argv[1]; without one (or 0), a free port, printed on
# standard output. Used by the scripts in tests/gpu/ and by tests/agent_cpu.sh.
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import sys
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200); self.send_header("content-length", "0"); self.end_headers()
    def log_message(self, *a): pass
port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
s = ThreadingHTTPServer(("127.0.0.1", port), H)
if port == 0:
    print(s.server_address[1], flush=True)
s.serve_forever()
