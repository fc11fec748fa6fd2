#!/usr/bin/env bash
# Run every benchmark one after another (never in parallel: they would measure each other),
# keeping each one's markdown output, progress log and JSON in OUTDIR. Used for
# docs/benchmarks.md. The server runs from this tree (PYTHONPATH), whatever the venv points at.
#
#   benchmarks/run_all.sh /tmp/bench-full            # full modes (about 30 minutes)
#   benchmarks/run_all.sh /tmp/bench-quick --quick   # every script's --quick mode (~4 minutes)
#   PY=/path/to/python benchmarks/run_all.sh OUT     # another interpreter (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: benchmarks/run_all.sh OUTDIR [--quick]}"
QUICK="${2:-}"
PY="${PY:-.venv/bin/python}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
{
  echo "commit $(git rev-parse --short HEAD)"
  git status --porcelain -- cproxy | sed 's/^/dirty /'
  echo "started $(date -Is) load $(cut -d' ' -f1-3 /proc/loadavg)"
  nproc
  grep -m1 'model name' /proc/cpuinfo
} > "$OUT/env.txt"
run() {
  local name="$1"; shift
  echo "== $name: $* ($(date +%T), load $(cut -d' ' -f1 /proc/loadavg))" | tee -a "$OUT/env.txt"
  "$PY" -m "benchmarks.$name" $QUICK --json "$OUT/$name.json" "$@" > "$OUT/$name.md" 2> "$OUT/$name.log"
}
run store_raw
run matrix
run isolation
run memory
run scaling
run isolation_engine
run stall_progress
run profile_server --raw "$OUT/profile_server.txt"
run e2e
if [ -n "$QUICK" ]; then run sdk_consumer; else run sdk_consumer --messages 20000 --rounds 7; fi
echo "finished $(date -Is) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/env.txt"
