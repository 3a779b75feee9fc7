#!/usr/bin/env bash
# PNAConv's memory and speed in one GPU call: the step of every variant against PyG's, interleaved
# (benchmarks/bench_pna.py; BEFORE=path/to/another/_pna.py adds that version as "before"), the
# per-operator memory log of the default layer and of feature chunks (benchmarks/pna_memory.py),
# then the PNA tests on CUDA.
#   PYTHONPATH=. OUT=/some/dir [BEFORE=old_pna.py] bash benchmarks/gpu/pna.sh
# The C++ extensions the tests' CPU references need build in the background on half the cores
# while the benchmarks run. Everything lands in $OUT/pna.tgz next to $OUT/summary.txt.
# Budget on an H100 host: about 3 minutes.
set -uo pipefail
: "${OUT:?set OUT to the output directory}"
export PYTHONPATH="${PYTHONPATH:-.}"
PY="${PYTHON:-python}"
WORK="$(mktemp -d)"
run() {  # run STEP TIMEOUT_S CMD...: logs to $WORK/STEP.log, rc and seconds to $WORK/summary.txt
  local step=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$WORK/$step.log" 2>&1
  echo "$step rc=$? $((SECONDS - start))s" | tee -a "$WORK/summary.txt"
}
export MAX_JOBS="${MAX_JOBS:-8}"
for ext in graph aggregate; do
  timeout 240 "$PY" -c "from gnnfuse._build import load_extension; load_extension('$ext')" > "$WORK/build_$ext.log" 2>&1 &
done
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$WORK/summary.txt"
before=()
[ -n "${BEFORE:-}" ] && before=(--before "$BEFORE")
run bench "${BENCH_TIMEOUT_S:-150}" "$PY" -m benchmarks.bench_pna --device cuda --rounds "${ROUNDS:-10}" \
  --suffix "${SUFFIX:-}" --out "$WORK" "${before[@]}"
for chunk in ${MEMORY_CHUNKS:-none 32 16}; do
  run "memory_$chunk" 60 "$PY" -m benchmarks.pna_memory --device cuda --nodes 170000 --edges 1170000 --chunk "$chunk" --top 30
done
wait
run tests "${TESTS_TIMEOUT_S:-120}" "$PY" -m pytest -q -p no:cacheprovider --maxfail=10 tests/test_aggr_pna.py
tail -n 3 "$WORK/tests.log"
grep -h "^|\|^- geomean" "$WORK"/aggregation-pna*.md 2>/dev/null
grep -h "^forward\|^backward" "$WORK"/memory_*.log 2>/dev/null
mkdir -p "$OUT"
cp "$WORK/summary.txt" "$OUT/summary.txt"
tar czf "$OUT/pna.tgz" -C "$WORK" .
exit 0
