#!/usr/bin/env bash
# Copies the files the chart ships from their sources in the repository into
# deploy/helm/gpuwatch/files/ (Helm's .Files only sees files inside the chart):
#   deploy/rules/*.yaml  -> files/rules/        (built-in alert rules)
#   dashboards/*.json    -> files/dashboards/   (Grafana dashboards)
#   deploy/grafana/datasource*.yaml -> files/grafana/ (Grafana data sources, addresses set by the
#                                      chart)
# `sync-files.sh --check` changes nothing and fails when a copy differs from its source, or a
# copy has no committed source any more (tests/deploy/check.sh runs it in CI).
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
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
sync_dir() { # source-dir glob dest-dir
  local src="$1" pattern="$2" dest="$3" f name rel
  mkdir -p "$dest"
  shopt -s nullglob
  # Sources are the files as committed (HEAD): others' uncommitted edits are not copied.
  local srcrel="${src#"$root"/}"
  while IFS= read -r rel; do
    name="$(basename "$rel")"
    # shellcheck disable=SC2053 # $pattern is a glob on purpose
    [[ "$(dirname "$rel")" == "$srcrel" && "$name" == $pattern ]] || continue
    git -C "$root" show "HEAD:$rel" > "$work/$name"
    if $check; then
      if ! cmp -s "$work/$name" "$dest/$name"; then
        echo "out of date: ${dest#"$root"/}/$name differs from $rel as committed (run deploy/helm/sync-files.sh)" >&2
        status=1
      fi
    else
      cp "$work/$name" "$dest/$name"
    fi
  done < <(git -C "$root" ls-tree --name-only HEAD -- "$srcrel/")
  for f in "$dest"/$pattern; do
    [[ -e "$f" ]] || continue
    name="$(basename "$f")"
    if ! git -C "$root" cat-file -e "HEAD:${src#"$root"/}/$name" 2>/dev/null; then
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
sync_dir "$root/deploy/grafana" 'datasource*.yaml' "$chart/files/grafana"
if $check && [[ $status -eq 0 ]]; then
  echo "chart files: in sync with deploy/rules, dashboards and deploy/grafana"
fi
exit "$status"
