#!/usr/bin/env bash
# The multi-aggregation forward's settings in one GPU call (benchmarks/bench_aggregation_variants.py):
# the graphs' kernels compiled in parallel processes (Triton's disk cache) while the multi-aggregation
# tests run on CUDA with TEST_TUNING as the default setting; then the interleaved timings, the public op
# (bench_aggregation's multi table with the fastest setting as default), and ncu sections of sum vs
# multi on arxiv-like F=64. Everything lands in $OUT/variants.tgz next to $OUT/summary.txt.
#   PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/aggregation_variants.sh
# Budget on an H100 host: about 4-5 minutes (at most 6: each step has its own timeout).
set -uo pipefail
: "${OUT:?set OUT to the output directory}"
export PYTHONPATH="${PYTHONPATH:-.}"
PY="${PYTHON:-python}"
WORK="$(mktemp -d)"
TEST_TUNING="${TEST_TUNING:-Tuning(x_evict='evict_last', out_evict='evict_first', row_unroll=2)}"
run() {  # run STEP TIMEOUT_S CMD...: logs to $WORK/STEP.log, rc and seconds to $WORK/summary.txt
  local step=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$WORK/$step.log" 2>&1
  echo "$step rc=$? $((SECONDS - start))s" | tee -a "$WORK/summary.txt"
}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a "$WORK/summary.txt"
export MAX_JOBS="${MAX_JOBS:-8}"
# the C++ extensions (the tests' CPU-tensor cases) build while the first GPU tests run
timeout 200 "$PY" -c "from gnnfuse._build import load_extension; load_extension('graph'); load_extension('aggregate')" \
  > "$WORK/build.log" 2>&1 &
for part in tests/test_multi_aggregate.py tests/test_op_parity.py; do
  name=$(basename "$part" .py)
  run "$name" "${TESTS_TIMEOUT_S:-170}" "$PY" -c "import sys, pytest; import gnnfuse.triton.multi_aggregate as M
M.DEFAULT_TUNING = M.$TEST_TUNING
print('default tuning', M.DEFAULT_TUNING, flush=True)
sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--maxfail=10', '$part', '-k', 'multi']))" &
done
i=0
for g in "arxiv-like (power-law)" "products-like (uniform)" community-arxiv rmat-arxiv community-products rmat-products; do
  i=$((i + 1))
  timeout "${WARM_TIMEOUT_S:-110}" "$PY" -m benchmarks.bench_aggregation_variants --warm "$g" > "$WORK/warm_$i.log" 2>&1 &
done
wait
echo "warm+tests $SECONDS s" | tee -a "$WORK/summary.txt"
tail -n 2 "$WORK"/test_*.log
run variants "${VARIANTS_TIMEOUT_S:-150}" "$PY" -m benchmarks.bench_aggregation_variants --official --out "$WORK"
if command -v ncu > /dev/null; then
  run ncu "${NCU_TIMEOUT_S:-45}" ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --metrics lts__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum \
    "$PY" -m benchmarks.bench_aggregation_variants --profile
fi
grep -h "^|\|^- geomean\|^- _multi" "$WORK"/aggregation-*.md 2>/dev/null
mkdir -p "$OUT"
cp "$WORK/summary.txt" "$OUT/summary.txt"
tar czf "$OUT/variants.tgz" -C "$WORK" .
exit 0
