#!/usr/bin/env python3
"""Starts the real binaries with what the rendered chart gives their pods.

For the server StatefulSet: the container's args and env, its ConfigMap and Secret volumes
written out as files, the pod paths (/etc/gpuwatch/..., /var/lib/gpuwatch, /tmp) mapped into a
temp dir and the 0.0.0.0 listeners moved to free loopback ports. Then: /readyz answers, the rules
files named by GPUWATCH_RULES are loaded, SQL without a token gets 401 and with the rendered
admin token (when the Secret is in the manifest) gets 200.
For the agent DaemonSet: its env and its token Secret volume (written out like the server's), with
--source synthetic (no NVML here). With the server in the same manifest, the agent then sends to
it (endpoint moved to the server's local OTLP port of the rendered protocol) with the token file
the chart mounts, and the server must store its samples: the agents' token of the chart is one
the server accepts. Alone (gpuwatch-agent.yaml), it runs --once, which checks the token file.
For the query nodes' Deployment (--role query, after the server has stopped and so persisted what
the agent sent): its args, env and files as for the server, on the same local S3 server. /readyz
answers, SQL without a token gets 401, with the admin token 200 and at least the rows the agent
had stored, and an OTLP write 403.

Usage: run_rendered.py BIN_DIR MANIFEST.yaml
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request

import yaml


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def get(url, token=None):
    req = urllib.request.Request(url)
    if token:
        req.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


# Tokens standing in for a Secret the manifest expects to exist (auth.existingSecret).
STANDIN_ADMIN = "rendered-test-token-0123456789"
STANDIN_AGENT = "rendered-agent-token-0123456789"


def main(bin_dir, manifest):
    docs = [d for d in yaml.safe_load_all(open(manifest)) if d]
    objs = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    tmp = tempfile.mkdtemp(prefix="gpuwatch-rendered-")
    servers = [d for d in docs if d["kind"] == "StatefulSet"]
    agents = [d for d in docs if d["kind"] == "DaemonSet"]
    queries = [d for d in docs if d["kind"] == "Deployment"]
    if not servers and not agents:
        sys.exit(f"{manifest}: no StatefulSet or DaemonSet")
    s3 = S3()
    stored = [0]
    try:
        for s in servers:
            then = None
            if agents:
                def then(ports, token, ds=agents[0]):
                    stored[0] = run_agent(bin_dir, ds, objs, tmp, (ports, token))
            run_server(bin_dir, s, objs, tmp, s3, then)
        if agents and not servers:
            run_agent(bin_dir, agents[0], objs, tmp, None)
        for d in queries:
            run_query(bin_dir, d, objs, tmp, s3, stored[0])
    finally:
        s3.stop()
    shutil.rmtree(tmp, ignore_errors=True)


class S3:
    """A local S3 server (moto, as the object-store e2e tests use), started on first use and
    shared by the server and the query nodes of one manifest."""

    def __init__(self):
        self.proc = None
        self.endpoint = None

    def env(self, url):
        """AWS_* variables pointing at it, with the bucket of url created."""
        if self.proc is None:
            port = free_port()
            self.proc = subprocess.Popen(["moto_server", "-H", "127.0.0.1", "-p", str(port)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.endpoint = f"http://127.0.0.1:{port}"
        bucket = url.removeprefix("s3://").split("/")[0]
        for _ in range(300):
            try:
                urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{bucket}", method="PUT"), timeout=2)
                break
            except urllib.error.HTTPError as e:
                if e.code == 409:  # BucketAlreadyOwnedByYou
                    break
                time.sleep(0.1)
            except OSError:
                time.sleep(0.1)
        else:
            sys.exit("moto_server did not start")
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true"}

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()


def mount_files(spec, container, objs, tmp):
    """Writes ConfigMap/Secret volumes under tmp; returns (pod path -> host path) mappings."""
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    mapping = {}
    token = None
    for m in container.get("volumeMounts", []):
        host = os.path.join(tmp, m["mountPath"].strip("/").replace("/", "_"))
        v = vols.get(m["name"], {})
        data = None
        if "configMap" in v:
            data = objs[("ConfigMap", v["configMap"]["name"])]["data"]
        elif "secret" in v:
            secret = objs.get(("Secret", v["secret"]["secretName"]))
            if secret is None:
                print(f"Secret {v['secret']['secretName']} is not in the manifest: "
                      "a test tokens file stands in for it")
                token = STANDIN_ADMIN
                data = {
                    "tokens.toml": f'[[tokens]]\nname = "admin"\ntoken = "{token}"\nscopes = ["admin"]\n\n'
                                   f'[[tokens]]\nname = "agent"\ntoken = "{STANDIN_AGENT}"\nscopes = ["ingest"]\n',
                    "agent-token": STANDIN_AGENT,
                }
            else:
                data = secret["stringData"]
            items = v["secret"].get("items")
            if items:
                data = {i["path"]: data[i["key"]] for i in items}
        if data is not None:
            if "subPath" in m:
                os.makedirs(os.path.dirname(host), exist_ok=True)
                with open(host, "w") as f:
                    f.write(data[m["subPath"]])
            else:
                os.makedirs(host, exist_ok=True)
                for k, text in data.items():
                    with open(os.path.join(host, k), "w") as f:
                        f.write(text)
        else:
            os.makedirs(host, exist_ok=True)
        mapping[m["mountPath"]] = host
    return mapping, token


def remap(value, mapping):
    """A pod path (or a comma list of them, or --flag=path) as the path on this machine."""
    if "," in value:
        return ",".join(remap(v, mapping) for v in value.split(","))
    if value.startswith("--") and "=" in value:
        flag, _, rest = value.partition("=")
        return f"{flag}={remap(rest, mapping)}"
    # Longest pod path first, so /etc/gpuwatch/rules/builtin wins over /etc/gpuwatch.
    for pod in sorted(mapping, key=len, reverse=True):
        if value == pod or value.startswith(pod + "/"):
            return mapping[pod] + value[len(pod):]
    return value


def admin_token(objs):
    """The admin token of the tokens Secret in the manifest, if there is one."""
    secret = next((d for (k, _), d in objs.items() if k == "Secret" and "tokens.toml" in d.get("stringData", {})), None)
    if secret:
        toks = tomllib.loads(secret["stringData"]["tokens.toml"])["tokens"]
        return next(t["token"] for t in toks if "admin" in t["scopes"])
    return None


def pod_env(c, objs, mapping, ports):
    """The container's env (pod paths remapped, listeners moved to free loopback ports, named
    in ports) and the AWS_* variables of its envFrom Secrets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_") and not k.startswith("AWS_")}
    for e in c.get("env", []):
        if "value" not in e:
            continue
        value = remap(e["value"], mapping)
        if e["name"].endswith("_ADDR") and value.split(":")[0] in ("0.0.0.0", "127.0.0.1"):
            ports[e["name"]] = free_port()
            value = f"127.0.0.1:{ports[e['name']]}"
        env[e["name"]] = value
    for ref in c.get("envFrom", []):
        env.update(objs[("Secret", ref["secretRef"]["name"])]["stringData"])
    return env


def stop(p):
    p.terminate()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()


def wait_ready(p, http, log):
    for _ in range(300):
        if p.poll() is not None:
            sys.exit(f"{os.path.basename(log)} exited {p.returncode}:\n{open(log).read()}")
        if get(f"{http}/readyz")[0] == 200:
            return
        time.sleep(0.1)
    sys.exit(f"not ready:\n{open(log).read()}")


def run_query(bin_dir, dep, objs, tmp, s3, stored):
    """A query node of the rendered Deployment on the server's prefix; stored: rows the agent
    had stored through the server (persisted when it stopped)."""
    spec = dep["spec"]["template"]["spec"]
    c = spec["containers"][0]
    mapping, token = mount_files(spec, c, objs, tmp)
    ports = {}
    env = pod_env(c, objs, mapping, ports)
    token = token or admin_token(objs)
    args = [remap(a, mapping) for a in c.get("args", [])]
    url = next(a.split("=", 1)[1] for a in args if a.startswith("--object-store="))
    env.update(s3.env(url))
    log = os.path.join(tmp, "query.log")
    with open(log, "w") as out:
        p = subprocess.Popen([os.path.join(bin_dir, "gpuwatch")] + args, env=env, stdout=out, stderr=out)
    http = f"http://127.0.0.1:{ports['GPUWATCH_HTTP_ADDR']}"
    try:
        wait_ready(p, http, log)
        q = f"{http}/api/v1/sql?format=json&q=SELECT+count(*)+AS+n+FROM+gpu_metrics"
        auth = "GPUWATCH_AUTH_TOKENS" in env
        if auth and get(q)[0] != 401:
            sys.exit("query node: SQL without a token did not get 401")
        status, body = get(q, token if auth else None)
        if status != 200:
            sys.exit(f"query node: SQL answered {status}: {body}")
        n = json.loads(body)[0]["n"]
        if n < stored:
            sys.exit(f"query node: {n} gpu_metrics rows, the server had stored {stored}")
        req = urllib.request.Request(f"{http}/v1/metrics", data=b"", method="POST",
                                     headers={"content-type": "application/x-protobuf",
                                              **({"authorization": f"Bearer {token}"} if auth else {})})
        try:
            urllib.request.urlopen(req, timeout=5)
            status = 200
        except urllib.error.HTTPError as e:
            status = e.code
        if status != 403:
            sys.exit(f"query node: an OTLP write answered {status}, not 403")
        errors = [line for line in open(log).read().splitlines() if " ERROR " in line]
        if errors:
            sys.exit("query node log has errors:\n" + "\n".join(errors))
        print(f"query node: started with the rendered args, env and files on {url} (moto); /readyz 200, "
              f"{n} gpu_metrics rows persisted by the server, OTLP write 403, "
              f"auth {'on' if auth else 'off'}")
    finally:
        stop(p)


def run_server(bin_dir, sts, objs, tmp, s3, then=None):
    spec = sts["spec"]["template"]["spec"]
    c = spec["containers"][0]
    mapping, token = mount_files(spec, c, objs, tmp)
    ports = {}
    env = pod_env(c, objs, mapping, ports)
    token = token or admin_token(objs)
    args = [remap(a, mapping) for a in c.get("args", [])]
    if "GPUWATCH_OBJECT_STORE" in env:
        # The AWS_* variables of the chart's Secret (envFrom), with the endpoint moved to the
        # local S3 server holding the URL's bucket.
        env.update(s3.env(env["GPUWATCH_OBJECT_STORE"]))
    log = os.path.join(tmp, "server.log")
    with open(log, "w") as out:
        p = subprocess.Popen([os.path.join(bin_dir, "gpuwatch")] + args, env=env, stdout=out, stderr=out)
    http = f"http://127.0.0.1:{ports['GPUWATCH_HTTP_ADDR']}"
    try:
        wait_ready(p, http, log)
        rules = [r for r in env.get("GPUWATCH_RULES", "").split(",") if r]
        status, _ = get(f"{http}/api/v1/sql?q=SELECT+1")
        if "GPUWATCH_AUTH_TOKENS" in env:
            if status != 401:
                sys.exit(f"server: SQL without a token answered {status}, not 401")
            status, body = get(f"{http}/api/v1/sql?q=SELECT+1+AS+one", token)
        if status != 200:
            sys.exit(f"server: SQL answered {status}")
        text = open(log).read()
        for r in rules:
            if not os.path.exists(r):
                sys.exit(f"server: rules file {r} missing")
        expected = sum(len(g.get("rules") or []) for r in rules
                       for g in (yaml.safe_load(open(r)) or {}).get("groups", []))
        if rules and f"rules={expected}" not in text:
            sys.exit(f"server: log does not say rules={expected} were loaded:\n{text}")
        errors = [line for line in text.splitlines() if " ERROR " in line]
        if errors:
            sys.exit("server log has errors:\n" + "\n".join(errors))
        print(f"server: started with the rendered args, env and files; /readyz 200, "
              f"{len(rules)} rules files with {expected} rules loaded, "
              f"auth {'on' if 'GPUWATCH_AUTH_TOKENS' in env else 'off'}"
              + (f", object store {env['GPUWATCH_OBJECT_STORE']} (moto)" if "GPUWATCH_OBJECT_STORE" in env else ""))
        if then:
            then({k: v for k, v in ports.items()}, token if "GPUWATCH_AUTH_TOKENS" in env else None)
    finally:
        # SIGTERM: the server persists what it buffered before it exits.
        stop(p)


def run_agent(bin_dir, ds, objs, tmp, server):
    """server: (the server's local listener ports by env name, its admin token or None)."""
    spec = ds["spec"]["template"]["spec"]
    c = spec["containers"][0]
    mapping, _ = mount_files(spec, c, objs, tmp)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
    for e in c["env"]:
        field = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if "value" in e:
            # Kubernetes expands $(NAME) of a variable defined earlier in the list.
            value = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), e["value"])
            env[e["name"]] = remap(value, mapping)
        elif field == "spec.nodeName":
            env[e["name"]] = "rendered-node"
        elif field == "status.hostIP":
            env[e["name"]] = "127.0.0.1"
    env["GPUWATCH_BUFFER_DIR"] = os.path.join(tmp, "spool")
    env["GPUWATCH_SOURCE"] = "synthetic"
    token_file = env.get("GPUWATCH_AUTH_TOKEN_FILE")
    if token_file and not os.path.isfile(token_file):
        sys.exit(f"agent: GPUWATCH_AUTH_TOKEN_FILE {token_file} is not a mounted file")
    agent = [os.path.join(bin_dir, "gpuwatch-agent"), "--synthetic-gpus", "2"] + c.get("args", [])
    if server is None:
        out = subprocess.run(agent + ["--once"], env=env, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            sys.exit(f"agent with the rendered env exited {out.returncode}: {out.stderr}")
        gpus = json.loads(out.stdout)["gpus"]
        print(f"agent: the rendered env {'and token file ' if token_file else ''}parse; "
              f"--once gave {len(gpus)} GPUs")
        return
    ports, token = server
    listener = "GPUWATCH_OTLP_GRPC_ADDR" if env.get("GPUWATCH_PROTOCOL") == "grpc" else "GPUWATCH_OTLP_HTTP_ADDR"
    env["GPUWATCH_ENDPOINT"] = f"http://127.0.0.1:{ports[listener]}"
    env.update(GPUWATCH_METRICS_ADDR="off", GPUWATCH_INTERVAL="500ms", GPUWATCH_FLUSH_INTERVAL="0s")
    log = open(os.path.join(tmp, "agent.log"), "w")
    p = subprocess.Popen(agent, env=env, stdout=subprocess.DEVNULL, stderr=log)
    http = f"http://127.0.0.1:{ports['GPUWATCH_HTTP_ADDR']}"
    q = "SELECT+count(*)+AS+n+FROM+gpu_metrics+WHERE+host+%3D+%27rendered-node%27"
    n = 0
    try:
        for _ in range(150):
            if p.poll() is not None:
                sys.exit(f"agent exited {p.returncode}:\n{open(log.name).read()}")
            status, body = get(f"{http}/api/v1/sql?format=json&q={q}", token)
            if status == 200:
                n = json.loads(body)[0]["n"]
                if n > 0:
                    break
            time.sleep(0.2)
    finally:
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
    text = open(log.name).read()
    if not n:
        sys.exit(f"agent: the rendered server stored no sample of it; agent log:\n{text}")
    if "refused" in text:
        sys.exit(f"agent: a send was refused:\n{text}")
    print(f"agent: with the rendered env{' and token file' if token_file else ''}, "
          f"{env['GPUWATCH_PROTOCOL']} to the rendered server: {n} samples stored")
    return n


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
