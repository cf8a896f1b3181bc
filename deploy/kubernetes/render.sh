#!/usr/bin/env bash
# Renders the plain manifests of this directory from the Helm chart, for clusters without Helm:
#   gpuwatch.yaml        server StatefulSet, Services, ConfigMaps, agent DaemonSet (release
#                        `gpuwatch`, namespace `gpuwatch`, values-plain.yaml)
#   gpuwatch-agent.yaml  the agent DaemonSet alone, sending to gpuwatch.gpuwatch.svc
# `render.sh --check` renders into a temp dir and fails when the committed files differ
# (tests/deploy/check.sh runs it). Needs `pip install helm-python-sdk` (Helm's Go library).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
chart="$root/deploy/helm/gpuwatch"
out="$here"
if [[ "${1:-}" == "--check" ]]; then
  out="$(mktemp -d)"
  trap 'rm -rf "$out"' EXIT
fi
header='# Rendered from deploy/helm/gpuwatch by deploy/kubernetes/render.sh: edit the chart, not this file.'
agent_values="$(mktemp)"
trap 'rm -f "$agent_values"; [[ "$out" != "$here" ]] && rm -rf "$out"' EXIT
printf 'server:\n  enabled: false\ngrafana:\n  datasource:\n    enabled: false\nagent:\n  endpoint: http://gpuwatch.gpuwatch.svc:4317\n' > "$agent_values"

render() { # file values...
  local file="$1"
  shift
  python3 "$root/tests/deploy/helm_sdk.py" template "$chart" gpuwatch gpuwatch "$out/$file.body" "$@" >/dev/null
  { echo "$header"; echo "---"; cat "$out/$file.body"; } > "$out/$file"
  rm -f "$out/$file.body" "$out/$file.body.NOTES.txt"
}
render gpuwatch.yaml "$here/values-plain.yaml"
render gpuwatch-agent.yaml "$here/values-plain.yaml" "$agent_values"

if [[ "$out" != "$here" ]]; then
  status=0
  for f in gpuwatch.yaml gpuwatch-agent.yaml; do
    if ! diff -u "$here/$f" "$out/$f"; then
      echo "deploy/kubernetes/$f is not what the chart renders: run deploy/kubernetes/render.sh" >&2
      status=1
    fi
  done
  [[ $status -eq 0 ]] && echo "plain manifests: equal to the chart's rendering"
  exit "$status"
fi
echo "rendered deploy/kubernetes/gpuwatch.yaml and gpuwatch-agent.yaml"
