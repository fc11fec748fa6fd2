#!/usr/bin/env bash
# Run every benchmark one after another (never in parallel: they would measure each other),
# keeping each one's markdown output and JSON in OUTDIR. Used for docs/benchmarks.md.
#
#   benchmarks/run_all.sh /tmp/bench-full           # full modes (about 45 minutes)
#   benchmarks/run_all.sh /tmp/bench-quick --quick  # every script's --quick mode (~3 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: benchmarks/run_all.sh OUTDIR [--quick]}"
QUICK="${2:-}"
PY=.venv/bin/python
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
  "$PY" "$@" > "$OUT/$name.md" 2> "$OUT/$name.log"
}
run store_raw benchmarks/store_raw.py $QUICK
run matrix -m benchmarks.matrix $QUICK --json "$OUT/matrix.json"
run isolation -m benchmarks.isolation $QUICK --json "$OUT/isolation.json"
run memory -m benchmarks.memory $QUICK --json "$OUT/memory.json"
run scaling -m benchmarks.scaling $QUICK --json "$OUT/scaling.json"
run isolation_engine -m benchmarks.isolation_engine $QUICK --json "$OUT/isolation_engine.json"
run profile -m benchmarks.profile_server $QUICK --json "$OUT/profile.json" --raw "$OUT/profile.txt"
if [ -n "$QUICK" ]; then
  run e2e -m benchmarks.e2e --quick --json "$OUT/e2e.json"
  run sdk benchmarks/sdk_consumer.py --messages 5000 --rounds 3
else
  run e2e -m benchmarks.e2e --json "$OUT/e2e.json"
  run sdk benchmarks/sdk_consumer.py --messages 20000 --rounds 7
fi
echo "finished $(date -Is) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/env.txt"
