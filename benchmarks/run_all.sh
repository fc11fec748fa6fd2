#!/usr/bin/env bash
# Run the scenarios of docs/benchmarks.md one after another (never in parallel: they would
# measure each other), with the commands the page shows, keeping each one's markdown report,
# progress log and JSON in OUTDIR. The server runs from this tree (PYTHONPATH).
#
#   benchmarks/run_all.sh /tmp/bench                # the page's commands (about 30 minutes)
#   benchmarks/run_all.sh /tmp/bench-quick --quick  # every scenario's --quick mode
#   PY=/path/to/python benchmarks/run_all.sh OUT    # another interpreter (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: benchmarks/run_all.sh OUTDIR [--quick]}"
QUICK="${2:-}"
PY="${PY:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
echo "commit $(git rev-parse --short HEAD), $(nproc) cores, started $(date -Is)" > "$OUT/env.txt"
run() {
  local name="$1"; shift
  [ -n "$QUICK" ] && set -- --quick
  echo "== $name $* ($(date +%T), load $(cut -d' ' -f1 /proc/loadavg))" | tee -a "$OUT/env.txt"
  "$PY" -m "benchmarks.$name" --json "$OUT/$name.json" "$@" > "$OUT/$name.md" 2> "$OUT/$name.log"
}
run peers --rounds 5
run latency --seconds 5 --rounds 5
run memory --messages 100000
run dedup --rounds 5
run longpoll --pullers 5000 --wait-ms 30000 --idle-s 20 --trickle-s 10
run spark_sink --sizes 200000 --rounds 5
run cluster --repeat 3 --handovers 3
run push --messages 20000 --rounds 3
echo "finished $(date -Is) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/env.txt"
