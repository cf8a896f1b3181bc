#!/usr/bin/env bash
# Runs every fuzz target for SECONDS seconds each (default 60): fuzz/run.sh [SECONDS] [TARGET...]
#
# cargo-fuzz passes nightly-only flags (-Z) to rustc. Where only a stable toolchain is
# installed, RUSTC_BOOTSTRAP=1 lets stable rustc accept them. Targets are built in debug mode
# (`--dev`: overflow checks and debug assertions on, and a build a fraction of release's) without
# a sanitizer (`-s none`: the code under test is safe Rust; what is sought is panics, aborts,
# overflows, runaway memory and hangs). Crashes land in fuzz/artifacts/<target>/; the corpus
# grows in fuzz/corpus/<target>/ (both ignored by git).
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-60}"
shift || true
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  targets=(otlp_protobuf otlp_json remote_write sql_gate sql_plan)
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1
features() { case "$1" in sql_gate | sql_plan) echo "--features gate" ;; esac; }
for t in "${targets[@]}"; do
  # shellcheck disable=SC2046
  cargo fuzz build --dev -s none $(features "$t") "$t"
done
status=0
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  # Seeds: the golden fixture's OTLP/JSON requests for the JSON decoder, the recipes for the gate.
  case "$t" in
    otlp_json) i=0; while IFS= read -r line; do i=$((i+1)); printf '%s' "$line" > "corpus/$t/fixture-$i"; done < ../tests/golden/fixture.jsonl ;;
    sql_gate | sql_plan) for f in ../tests/golden/*.sql; do cp "$f" "corpus/$t/$(basename "$f")"; done ;;
  esac
  echo "== $t: ${secs}s"
  # shellcheck disable=SC2046
  if ! cargo fuzz run --dev -s none $(features "$t") "$t" "corpus/$t" -- \
      -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len=65536 -print_final_stats=1; then
    echo "== $t: FAILED (see fuzz/artifacts/$t/)"
    status=1
  fi
done
exit $status
