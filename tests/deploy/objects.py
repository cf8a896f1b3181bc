#!/usr/bin/env python3
"""Cross-object checks of rendered Kubernetes manifests, which schema validation cannot see:
selectors that match their pods, Service and probe ports that exist, ConfigMaps and Secrets
that mounts name, rules files that GPUWATCH_RULES names, the tokens file's format, the agents'
token file (a read-only, owner/group-only Secret directory mount holding an ingest token of the
server's tokens file), no mapping key given twice, the query nodes' Deployment against the
server (check_query_node), the ServiceMonitor/PodMonitor (no OpenAPI schema offline) against
their targets, and the PodSecurity "restricted" settings of the server and query pods. Usage: objects.py MANIFEST.yaml...
"""
import sys
import tomllib

import yaml

errors = []


class UniqueKeyLoader(yaml.SafeLoader):
    """Refuses a mapping key given twice, as kustomize and other YAML v1.2 parsers do (PyYAML
    and Kubernetes' own decoder keep the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"mapping key {key!r} given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def err(where, msg):
    errors.append(f"{where}: {msg}")


def pod_spec(obj):
    return obj["spec"]["template"]["spec"], obj["spec"]["template"]["metadata"].get("labels", {})


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def check_agent_token(where, c, env, mounts, secrets, auth_on):
    path = env.get("GPUWATCH_AUTH_TOKEN_FILE")
    if not path:
        if auth_on:
            err(where, "the server requires tokens but the agent has no GPUWATCH_AUTH_TOKEN_FILE: its writes get 401")
        return
    directory, _, name = path.rpartition("/")
    vol = mounts.get(directory)
    mount = next((m for m in c["volumeMounts"] if m["mountPath"] == directory), None)
    if not vol or "secret" not in vol or not mount:
        err(where, f"token file {path}: no Secret volume mounted at {directory}")
        return
    if not mount.get("readOnly"):
        err(where, f"token mount {directory} must be read-only")
    if "subPath" in mount:
        err(where, "token mount uses subPath: Secret updates would never reach the pod")
    mode = vol["secret"].get("defaultMode")
    if mode is None or mode & 0o037:
        err(where, f"token file mode {mode if mode is None else oct(mode)}: use 0400 or 0440")
    items = {i["path"]: i["key"] for i in vol["secret"].get("items", [])}
    if name not in items:
        err(where, f"token Secret volume has no item with path {name}")
        return
    secret = secrets.get(vol["secret"]["secretName"])
    if secret is None:
        print(f"{where}: Secret {vol['secret']['secretName']} (key {items[name]}) is expected to exist already")
        return
    data = secret.get("stringData", {})
    token = data.get(items[name])
    if not token:
        err(where, f"Secret {vol['secret']['secretName']} has no key {items[name]}")
        return
    if "tokens.toml" in data:
        scopes = [t.get("scopes", []) for t in tomllib.loads(data["tokens.toml"]).get("tokens", [])
                  if t.get("token") == token]
        if not scopes or not {"ingest", "admin"} & set(scopes[0]):
            err(where, "the agent's token is not an ingest (or admin) token of tokens.toml")


def flag(args, name):
    """The value of --name=VALUE in args, or None."""
    return next((a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")), None)


def secrets_of(container, spec):
    """The Secrets a container gets: envFrom, and its pod's Secret volumes."""
    return ([r["secretRef"]["name"] for r in container.get("envFrom", [])],
            sorted(v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v))


def check_query_node(where, w, c, env, mounts, by_kind):
    """A query Deployment: --role=query on the server's object-store prefix, with its
    credentials, tokens and config; no rules, no maintenance, no claim; probes on /readyz and
    /healthz; its Services expose HTTP and Postgres only."""
    args = c.get("args", [])
    if flag(args, "role") != "query" or flag(args, "maintenance") != "off":
        err(where, "a Deployment of gpuwatch must run --role=query --maintenance=off (the server is the one maintainer)")
    url = flag(args, "object-store")
    if not url or not url.startswith("s3://"):
        err(where, "a query node needs --object-store=s3://...: it cannot read the server's volume")
    if any(a.startswith("--rules") for a in args) or "GPUWATCH_RULES" in env:
        err(where, "a query node refuses --rules")
    spec = pod_spec(w)[0]
    if any("persistentVolumeClaim" in v for v in spec.get("volumes", [])):
        err(where, "a query node needs no claim")
    data_dir = env.get("GPUWATCH_DATA_DIR", "")
    if not any((data_dir == m or data_dir.startswith(m + "/")) and v and "emptyDir" in v for m, v in mounts.items()):
        err(where, f"data directory {data_dir!r} is not in an emptyDir (the root filesystem is read-only)")
    if c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/readyz" or \
            c.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/healthz":
        err(where, "probes: readiness on /readyz, liveness on /healthz")
    for name, sts in by_kind.get("StatefulSet", {}).items():
        sspec = pod_spec(sts)[0]
        sc = sspec["containers"][0]
        senv = {e["name"]: e.get("value") for e in sc.get("env", [])}
        if senv.get("GPUWATCH_OBJECT_STORE") != url:
            err(where, f"--object-store {url} is not the server's ({senv.get('GPUWATCH_OBJECT_STORE')})")
        if secrets_of(sc, sspec) != secrets_of(c, spec):
            err(where, f"object-store and token Secrets {secrets_of(c, spec)} differ from the server's {secrets_of(sc, sspec)}")
        for k in ("GPUWATCH_AUTH_TOKENS", "GPUWATCH_INSECURE_NO_AUTH"):
            if senv.get(k) != env.get(k):
                err(where, f"{k} differs from the server's")
    for name, svc in by_kind.get("Service", {}).items():
        if matches(svc["spec"]["selector"], pod_spec(w)[1]):
            extra = {p["name"] for p in svc["spec"]["ports"]} - {"http", "postgres"}
            if extra:
                err(f"{where}: Service/{name}", f"exposes {sorted(extra)}: a query node takes no writes")


def check(path):
    with open(path) as f:
        docs = [d for d in yaml.load_all(f, Loader=UniqueKeyLoader) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    workloads = {**by_kind.get("StatefulSet", {}), **by_kind.get("DaemonSet", {}),
                 **by_kind.get("Deployment", {})}
    # Auth is on when the server has tokens, or, for the agent alone, when the agent has a token.
    servers = [pod_spec(s)[0]["containers"][0] for s in by_kind.get("StatefulSet", {}).values()]
    auth_on = any(e["name"] == "GPUWATCH_AUTH_TOKENS" for c in servers for e in c.get("env", []))
    configmaps = by_kind.get("ConfigMap", {})
    secrets = by_kind.get("Secret", {})

    for name, w in workloads.items():
        where = f"{path}: {w['kind']}/{name}"
        spec, labels = pod_spec(w)
        if not matches(w["spec"]["selector"]["matchLabels"], labels):
            err(where, "selector does not match the pod template's labels")
        for c in spec["containers"]:
            ports = {p["name"] for p in c.get("ports", [])}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if port is not None and port not in ports:
                    err(where, f"{probe} port {port} is not a container port")
            vols = {v["name"]: v for v in spec.get("volumes", [])}
            claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
            mounts = {}
            for m in c.get("volumeMounts", []):
                if m["name"] not in vols and m["name"] not in claims:
                    err(where, f"mount {m['name']} has no volume")
                mounts[m["mountPath"]] = vols.get(m["name"])
            for v in vols.values():
                if "configMap" in v and v["configMap"]["name"] not in configmaps:
                    err(where, f"ConfigMap {v['configMap']['name']} is not in the manifests")
                if "secret" in v and v["secret"]["secretName"] not in secrets:
                    print(f"{where}: Secret {v['secret']['secretName']} is expected to exist already")
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            for rule in filter(None, (env.get("GPUWATCH_RULES") or "").split(",")):
                directory, _, key = rule.rpartition("/")
                vol = mounts.get(directory)
                if not vol or "configMap" not in vol:
                    err(where, f"rules file {rule}: no ConfigMap mounted at {directory}")
                    continue
                cm = configmaps.get(vol["configMap"]["name"], {})
                if key not in cm.get("data", {}):
                    err(where, f"rules file {rule}: ConfigMap {vol['configMap']['name']} has no key {key}")
                else:
                    yaml.safe_load(cm["data"][key])
            if w["kind"] in ("StatefulSet", "Deployment"):
                sc, psc = c.get("securityContext", {}), spec.get("securityContext", {})
                if not (psc.get("runAsNonRoot") and sc.get("readOnlyRootFilesystem")
                        and sc.get("allowPrivilegeEscalation") is False
                        and sc.get("capabilities", {}).get("drop") == ["ALL"]
                        and psc.get("seccompProfile", {}).get("type") == "RuntimeDefault"):
                    err(where, "pod is not PodSecurity 'restricted'")
                if not ("GPUWATCH_AUTH_TOKENS" in env or env.get("GPUWATCH_INSECURE_NO_AUTH") == "true"):
                    err(where, "binds 0.0.0.0 without GPUWATCH_AUTH_TOKENS: the server would refuse to start")
                if "/etc/gpuwatch/gpuwatch.toml" in mounts:
                    cm = configmaps[mounts["/etc/gpuwatch/gpuwatch.toml"]["configMap"]["name"]]
                    tomllib.loads(cm["data"]["gpuwatch.toml"])
            if w["kind"] == "Deployment":
                check_query_node(where, w, c, env, mounts, by_kind)
            if w["kind"] == "DaemonSet":
                m = next((m for m in c["volumeMounts"] if m["mountPath"] == "/var/lib/kubelet/pod-resources"), None)
                if not m or not m.get("readOnly"):
                    err(where, "pod-resources must be mounted read-only")
                check_agent_token(where, c, env, mounts, secrets, auth_on)

    for name, svc in by_kind.get("Service", {}).items():
        where = f"{path}: Service/{name}"
        targets = [w for w in workloads.values() if matches(svc["spec"]["selector"], pod_spec(w)[1])]
        if len(targets) != 1:
            err(where, f"selector matches {len(targets)} workloads")
            continue
        ports = {p["name"] for c in pod_spec(targets[0])[0]["containers"] for p in c.get("ports", [])}
        for p in svc["spec"]["ports"]:
            if isinstance(p["targetPort"], str) and p["targetPort"] not in ports:
                err(where, f"targetPort {p['targetPort']} is not a container port")

    for name, s in secrets.items():
        data = s.get("stringData", {})
        if "tokens.toml" in data:
            tokens = tomllib.loads(data["tokens.toml"]).get("tokens", [])
            if not tokens:
                err(f"{path}: Secret/{name}", "tokens.toml has no [[tokens]]")
            for t in tokens:
                if len(t.get("token", "")) < 16 or not t.get("scopes") or \
                        not set(t["scopes"]) <= {"ingest", "query", "admin"}:
                    err(f"{path}: Secret/{name}", f"token {t.get('name')}: short or bad scopes")

    for name, sm in by_kind.get("ServiceMonitor", {}).items():
        sel = sm["spec"]["selector"]["matchLabels"]
        hits = [s for s in by_kind.get("Service", {}).values() if matches(sel, s["metadata"].get("labels", {}))]
        if len(hits) != 1:
            err(f"{path}: ServiceMonitor/{name}", f"selects {len(hits)} Services, not 1")
        else:
            names = {p["name"] for p in hits[0]["spec"]["ports"]}
            for e in sm["spec"]["endpoints"]:
                if e["port"] not in names:
                    err(f"{path}: ServiceMonitor/{name}", f"port {e['port']} is not a port of the Service")
    for name, pm in by_kind.get("PodMonitor", {}).items():
        sel = pm["spec"]["selector"]["matchLabels"]
        hits = [w for w in workloads.values() if matches(sel, pod_spec(w)[1])]
        if len(hits) != 1:
            err(f"{path}: PodMonitor/{name}", f"selects {len(hits)} workloads, not 1")
        else:
            names = {p["name"] for c in pod_spec(hits[0])[0]["containers"] for p in c.get("ports", [])}
            for e in pm["spec"]["podMetricsEndpoints"]:
                if e["port"] not in names:
                    err(f"{path}: PodMonitor/{name}", f"port {e['port']} is not a container port")
    print(f"{path}: {len(docs)} objects consistent" if not errors else f"{path}: checked")


for p in sys.argv[1:]:
    check(p)
if errors:
    print("\n".join(errors), file=sys.stderr)
    sys.exit(1)
