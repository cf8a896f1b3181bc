# An OTLP/HTTP receiver for the self-telemetry test: decodes every trace and metric export
# (protobuf, gzip allowed) with the OpenTelemetry Python packages and appends one JSON line per
# span or metric to the file argv[1]. Listens on a free port, printed on standard output.
import gzip
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

out = open(sys.argv[1], "a", buffering=1)


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path == "/v1/traces":
            req = ExportTraceServiceRequest.FromString(body)
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        attrs = {a.key: a.value.string_value or a.value.int_value for a in s.attributes}
                        out.write(json.dumps({
                            "kind": "span", "name": s.name, "trace": s.trace_id.hex(),
                            "id": s.span_id.hex(), "parent": s.parent_span_id.hex(),
                            "attributes": attrs,
                        }) + "\n")
        elif self.path == "/v1/metrics":
            req = ExportMetricsServiceRequest.FromString(body)
            for rm in req.resource_metrics:
                service = [a.value.string_value for a in rm.resource.attributes if a.key == "service.name"]
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        out.write(json.dumps({"kind": "metric", "name": m.name, "service": service}) + "\n")
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
