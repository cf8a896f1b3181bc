#!/usr/bin/env bash
# Checks every deployment artefact with the real tools (installed by .ci/run's "deploy linters"
# block): shellcheck on every shell script, hadolint on the Dockerfiles, systemd-analyze verify
# on the units, Helm's lint and template engine (helm-python-sdk) on the chart with its default
# values and with tests/deploy/values-s3-monitoring.yaml (object store, query nodes), the chart's
# refusal of query nodes without an object store, kubernetes-validate (strict, offline
# OpenAPI schemas) on every rendered object and on the plain manifests, the chart's file copies
# and the plain manifests against their sources, and `gpuwatch rules check` on the chart's rules.
# Exits non-zero on the first failing step. Run from anywhere: bash tests/deploy/check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
K8S_VERSION="${K8S_VERSION:-1.30.0}"

step() { echo "== deploy: $*"; }

step "shellcheck (every shell script tracked by git)"
mapfile -t scripts < <(git ls-files | while read -r f; do
  [[ -f "$f" ]] || continue
  case "$f" in
    *.sh) echo "$f" ;;
    *) head -c 64 "$f" 2>/dev/null | head -n 1 | grep -qE '^#!.*\b(ba)?sh\b' && echo "$f" ;;
  esac
done)
# Scripts of this change not yet tracked are checked too.
for f in deploy/helm/sync-files.sh deploy/kubernetes/render.sh tests/deploy/check.sh; do
  [[ " ${scripts[*]} " == *" $f "* ]] || scripts+=("$f")
done
shellcheck --version | sed -n 2p
shellcheck "${scripts[@]}"
echo "shellcheck: ${#scripts[@]} scripts clean"

step "hadolint (deploy/container)"
hadolint --version
hadolint --config deploy/container/.hadolint.yaml deploy/container/Dockerfile.server deploy/container/Dockerfile.agent
echo "hadolint: 2 Dockerfiles clean"

step "systemd-analyze verify (deploy/systemd)"
# A throwaway root holding the units, the unit files they depend on and the binaries their
# ExecStart names (verify checks that the command exists and is executable).
sysroot="$work/sysroot"
mkdir -p "$sysroot/etc/systemd/system" "$sysroot/usr/local/bin" "$sysroot/usr/lib/systemd"
cp -a /usr/lib/systemd/system "$sysroot/usr/lib/systemd/"
cp deploy/systemd/*.service "$sysroot/etc/systemd/system/"
for bin in gpuwatch gpuwatch-agent; do
  if [[ ! -x "target/debug/$bin" ]]; then
    echo "target/debug/$bin is missing: cargo build -p gpuwatch -p gpuwatch-agent first" >&2
    exit 1
  fi
  ln "$root/target/debug/$bin" "$sysroot/usr/local/bin/$bin" 2>/dev/null || cp "target/debug/$bin" "$sysroot/usr/local/bin/"
done
units=()
for u in deploy/systemd/*.service; do units+=("$(basename "$u")"); done
# verify exits 0 on unknown keys and other warnings: any output is a failure here.
if ! out="$(systemd-analyze verify --root="$sysroot" "${units[@]}" 2>&1)" || [[ -n "$out" ]]; then
  echo "$out" >&2
  echo "systemd-analyze verify: problems above" >&2
  exit 1
fi
echo "systemd-analyze verify: ${units[*]} clean"
for u in "${units[@]}"; do
  systemd-analyze security --offline=yes --root="$sysroot" "$u" 2>/dev/null | tail -n 1
done

step "the agent unit's capabilities suffice for Slurm attribution, and each one is needed"
# A job's process, run by another user (nobody) with SLURM_JOB_ID in its environment, holds a
# fake GPU open; the agent (--source fake) runs as root with only the unit's
# CapabilityBoundingSet and must label the GPU and the process with the job.
caps="$(sed -n 's/^CapabilityBoundingSet=//p' deploy/systemd/gpuwatch-agent.service)"
mkdir -p "$work/fakedev"
: > "$work/fakedev/nvidia0"
chmod 0755 "$work"
chmod 0666 "$work/fakedev/nvidia0"
# shellcheck disable=SC2016 # $1 is expanded by the inner bash
setpriv --reuid=65534 --regid=65534 --clear-groups env SLURM_JOB_ID=4242 SLURM_JOB_USER=nobody \
  bash -c 'exec 3<"$1"; exec sleep 60' _ "$work/fakedev/nvidia0" &
job_pid=$!
sleep 0.5
attributed() { # bounding set for setpriv
  setpriv --bounding-set="$1" --inh-caps=-all -- target/debug/gpuwatch-agent --source fake \
    --synthetic-gpus 1 --fake-dev-dir "$work/fakedev" --job-mapping-dir "$work/nomap" --once 2>/dev/null \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); print(",".join(sorted({(p.get("job") or {}).get("id") or "-" for p in d["processes"]} | {(d["gpus"][0].get("job") or {}).get("id") or "-"})))'
}
set_caps="-all"
for c in $caps; do set_caps+=",+$(tr '[:upper:]' '[:lower:]' <<< "${c#CAP_}")"; done
got="$(attributed "$set_caps")"
if [[ "$got" != 4242 ]]; then
  kill "$job_pid"
  echo "agent with CapabilityBoundingSet=$caps: job ids seen '$got', not 4242" >&2
  exit 1
fi
echo "agent with CapabilityBoundingSet=$caps: GPU and process attributed to job 4242"
for c in $caps; do
  fewer="-all"
  for o in $caps; do [[ "$o" == "$c" ]] || fewer+=",+$(tr '[:upper:]' '[:lower:]' <<< "${o#CAP_}")"; done
  got="$(attributed "$fewer")"
  if [[ "$got" == 4242 ]]; then
    kill "$job_pid"
    echo "the agent attributes the job without $c: drop it from the unit" >&2
    exit 1
  fi
  echo "without $c: not attributed ($got), so the unit keeps it"
done
kill "$job_pid"

step "chart file copies (deploy/helm/sync-files.sh --check)"
bash deploy/helm/sync-files.sh --check

chart=deploy/helm/gpuwatch
step "helm lint + template (Helm's Go library from helm-python-sdk)"
python3 tests/deploy/helm_sdk.py lint "$chart"
python3 tests/deploy/helm_sdk.py lint "$chart" tests/deploy/values-s3-monitoring.yaml
python3 tests/deploy/helm_sdk.py lint "$chart" tests/deploy/values-noauth.yaml
python3 tests/deploy/helm_sdk.py template "$chart" gw gpuwatch "$work/default.yaml"
python3 tests/deploy/helm_sdk.py template "$chart" gw gpuwatch "$work/s3.yaml" tests/deploy/values-s3-monitoring.yaml
python3 tests/deploy/helm_sdk.py template "$chart" gw gpuwatch "$work/noauth.yaml" tests/deploy/values-noauth.yaml
# Query nodes read the tables from the object store: without server.objectStore.url the chart
# refuses to render them.
printf 'queryNodes:\n  enabled: true\n' > "$work/query-no-s3.values.yaml"
if out="$(python3 tests/deploy/helm_sdk.py template "$chart" gw gpuwatch "$work/query-no-s3.yaml" "$work/query-no-s3.values.yaml" 2>&1)"; then
  echo "queryNodes.enabled without server.objectStore.url rendered; it must fail" >&2
  exit 1
fi
if ! grep -qF 'queryNodes.enabled needs server.objectStore.url' <<< "$out"; then
  echo "$out" >&2
  echo "queryNodes.enabled without server.objectStore.url failed without saying why" >&2
  exit 1
fi
echo "queryNodes.enabled without server.objectStore.url: refused: $(grep -F 'queryNodes.enabled needs' <<< "$out" | head -n 1)"

step "rendered objects: consistency (selectors, ports, mounts, rules, tokens)"
python3 tests/deploy/objects.py "$work/default.yaml" "$work/s3.yaml" "$work/noauth.yaml" deploy/kubernetes/gpuwatch.yaml deploy/kubernetes/gpuwatch-agent.yaml
# NOTES.txt says where the agents' token comes from while auth is on, and warns when auth is off.
grep -q 'They send the bearer token of Secret gw-gpuwatch-tokens, key agent-token' "$work/default.yaml.NOTES.txt"
if grep -q 'bearer token of Secret' "$work/noauth.yaml.NOTES.txt"; then exit 1; fi
grep -q 'WARNING: auth.enabled=false' "$work/noauth.yaml.NOTES.txt"

step "kubernetes-validate --strict (Kubernetes $K8S_VERSION OpenAPI schemas, offline)"
kubernetes-validate --version
# ServiceMonitor and PodMonitor (monitoring.coreos.com/v1) have no schema in the package: they
# are reported as skipped by kubernetes-validate and checked by objects.py instead.
for f in "$work/default.yaml" "$work/s3.yaml" "$work/noauth.yaml" deploy/kubernetes/gpuwatch.yaml deploy/kubernetes/gpuwatch-agent.yaml; do
  out="$(kubernetes-validate --strict --quiet -k "$K8S_VERSION" "$f" 2>&1)" || { echo "$out" >&2; exit 1; }
  bad="$(printf '%s\n' "$out" | grep -v "Couldn't find schema for kind \(ServiceMonitor\|PodMonitor\) with api version monitoring.coreos.com/v1" | grep -v '^$' || true)"
  if [[ -n "$bad" ]]; then
    echo "$bad" >&2
    exit 1
  fi
  echo "kubernetes-validate: $f: $(grep -c '^kind:' "$f") objects valid"
done

step "the real binaries start with what the rendered pods get (args, env, ConfigMaps, Secrets)"
python3 tests/deploy/run_rendered.py target/debug "$work/default.yaml"
python3 tests/deploy/run_rendered.py target/debug deploy/kubernetes/gpuwatch.yaml
python3 tests/deploy/run_rendered.py target/debug deploy/kubernetes/gpuwatch-agent.yaml
python3 tests/deploy/run_rendered.py target/debug "$work/s3.yaml"
python3 tests/deploy/run_rendered.py target/debug "$work/noauth.yaml"

step "plain manifests = chart rendering (deploy/kubernetes/render.sh --check)"
bash deploy/kubernetes/render.sh --check

step "the chart's rules files pass gpuwatch rules check"
for f in "$chart"/files/rules/*.yaml; do
  target/debug/gpuwatch rules check "$f"
done
echo "deploy checks: all passed"
