#!/usr/bin/env bash
# Copies the files the chart ships from their sources in the repository into
# deploy/helm/gpuwatch/files/ (Helm's .Files only sees files inside the chart):
#   deploy/rules/*.yaml  -> files/rules/        (built-in alert rules)
#   dashboards/*.json    -> files/dashboards/   (Grafana dashboards)
# `sync-files.sh --check` changes nothing and fails when a copy differs from its source, or a
# copy has no tracked source any more (tests/deploy/check.sh runs it in CI).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
chart="$root/deploy/helm/gpuwatch"
check=false
if [[ "${1:-}" == "--check" ]]; then
  check=true
elif [[ $# -gt 0 ]]; then
  echo "usage: $0 [--check]" >&2
  exit 2
fi

status=0
sync_dir() { # source-dir glob dest-dir
  local src="$1" pattern="$2" dest="$3" f name
  mkdir -p "$dest"
  shopt -s nullglob
  # Sources are the files git tracks (work in progress is not copied before it is committed).
  while IFS= read -r f; do
    f="$root/$f"
    name="$(basename "$f")"
    if $check; then
      if ! cmp -s "$f" "$dest/$name"; then
        echo "out of date: ${dest#"$root"/}/$name differs from ${f#"$root"/} (run deploy/helm/sync-files.sh)" >&2
        status=1
      fi
    else
      cp "$f" "$dest/$name"
    fi
  done < <(git -C "$root" ls-files -- "${src#"$root"/}/$pattern")
  for f in "$dest"/$pattern; do
    name="$(basename "$f")"
    if ! git -C "$root" ls-files --error-unmatch -- "${src#"$root"/}/$name" >/dev/null 2>&1; then
      if $check; then
        echo "stale: ${dest#"$root"/}/$name has no source ${src#"$root"/}/$name (run deploy/helm/sync-files.sh)" >&2
        status=1
      else
        rm -f "$f"
      fi
    fi
  done
  shopt -u nullglob
}

sync_dir "$root/deploy/rules" '*.yaml' "$chart/files/rules"
sync_dir "$root/dashboards" '*.json' "$chart/files/dashboards"
if $check && [[ $status -eq 0 ]]; then
  echo "chart files: in sync with deploy/rules and dashboards"
fi
exit "$status"
