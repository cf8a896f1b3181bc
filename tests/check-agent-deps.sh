#!/usr/bin/env bash
# Fails if gpuwatch-agent depends, directly or not, on DataFusion, Parquet or Arrow: the agent runs
# on every GPU host and must stay small.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=$(cargo tree --locked -p gpuwatch-agent -e normal,build --prefix none --format '{p}')
heavy=$(printf '%s\n' "$tree" | grep -E '^(datafusion|parquet|arrow)[-_a-z]* ' | sort -u || true)
if [ -n "$heavy" ]; then
  echo "gpuwatch-agent must not depend on these (move the code that needs them to the server):" >&2
  printf '%s\n' "$heavy" | sed 's/^/  /' >&2
  exit 1
fi
echo "gpuwatch-agent: $(printf '%s\n' "$tree" | sort -u | wc -l) crates, none of datafusion/parquet/arrow"
