#!/usr/bin/env bash
# The aggregation work (multi-aggregation, scatter, PNAConv) in one GPU call: the kernel-only plan
# timings, bench_aggregation (multi, scatter, pna), then the aggregation tests on CUDA.
#   PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/aggregation.sh
# The C++ extensions the tests' CPU-tensor cases need build in the background while the benchmarks
# run (they need none). Everything lands in $OUT/aggregation.tgz next to $OUT/summary.txt.
# Budget on an H100/H200 host: about 4 minutes.
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
export MAX_JOBS="${MAX_JOBS:-16}"
for ext in graph aggregate; do
  timeout 240 "$PY" -c "from gnnfuse._build import load_extension; load_extension('$ext')" > "$WORK/build_$ext.log" 2>&1 &
done
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$WORK/summary.txt"
run plans "${PLANS_TIMEOUT_S:-60}" "$PY" benchmarks/bench_aggregation_plans.py --quick
run bench "${AGG_TIMEOUT_S:-200}" "$PY" -m benchmarks.bench_aggregation --device cuda --rounds 5 --out "$WORK"
wait
run tests "${TESTS_TIMEOUT_S:-180}" "$PY" -m pytest -q -p no:cacheprovider --maxfail=10 tests/test_multi_aggregate.py \
  tests/test_scatter_api.py tests/test_aggr_pna.py
tail -n 3 "$WORK/tests.log"
grep -h "^|\|^- geomean" "$WORK"/aggregation-*.md 2>/dev/null
mkdir -p "$OUT"
cp "$WORK/summary.txt" "$OUT/summary.txt"
tar czf "$OUT/aggregation.tgz" -C "$WORK" .
exit 0
