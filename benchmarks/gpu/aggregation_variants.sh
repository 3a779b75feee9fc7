#!/usr/bin/env bash
# The multi-aggregation forward's settings in one GPU call (benchmarks/bench_aggregation_variants.py):
# the graphs' kernels compiled in parallel processes (Triton's disk cache) while the multi-aggregation
# tests run on CUDA (with TEST_TUNING as the default setting); then the interleaved timings, the public op
# and bench_aggregation's multi table (the fastest setting at F=64 as the default), and (NCU=1) ncu sections
# of sum vs multi on arxiv-like F=64. Everything lands in $OUT/variants.tgz next to $OUT/summary.txt.
#   PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/aggregation_variants.sh
# VARIANTS / SIDE_VARIANTS: the settings timed at F=64 / at F=32 and 128 (names in the script's variants());
# GRAPHS: comma-separated. Budget on an H100 host: about 4 minutes with every graph (each step has a timeout).
set -uo pipefail
: "${OUT:?set OUT to the output directory}"
export PYTHONPATH="${PYTHONPATH:-.}"
PY="${PYTHON:-python}"
WORK="$(mktemp -d)"
TEST_TUNING="${TEST_TUNING:-Tuning()}"
GRAPHS="${GRAPHS:-arxiv-like (power-law),products-like (uniform),community-arxiv,rmat-arxiv,community-products,rmat-products}"
ARGS=(--variants "${VARIANTS:-current,combine1,seg512,seg256,out_first}" --side-variants "${SIDE_VARIANTS:-current,combine1,seg512}")
run() {  # run STEP TIMEOUT_S CMD...: logs to $WORK/STEP.log, rc and seconds to $WORK/summary.txt
  local step=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$WORK/$step.log" 2>&1
  echo "$step rc=$? $((SECONDS - start))s" | tee -a "$WORK/summary.txt"
}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a "$WORK/summary.txt"
export MAX_JOBS="${MAX_JOBS:-8}"
# the C++ extensions (the tests' CPU-tensor cases) build while the first GPU tests run; BUILD=0: no build
# (then TEST_K should leave those cases out, e.g. TEST_K="multi and not compile")
if [ "${BUILD:-1}" = 1 ]; then
  timeout 200 "$PY" -c "from gnnfuse._build import load_extension; load_extension('graph'); load_extension('aggregate')" \
    > "$WORK/build.log" 2>&1 &
fi
for part in tests/test_multi_aggregate.py tests/test_op_parity.py; do
  name=$(basename "$part" .py)
  run "$name" "${TESTS_TIMEOUT_S:-170}" "$PY" -c "import sys, pytest; import gnnfuse.triton.multi_aggregate as M
M.DEFAULT_TUNING = M.$TEST_TUNING
print('default tuning', M.DEFAULT_TUNING, flush=True)
sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--maxfail=10', '$part', '-k', '${TEST_K:-multi}']))" &
done
i=0
IFS=, read -ra graph_list <<< "$GRAPHS"
for g in "${graph_list[@]}"; do
  i=$((i + 1))
  timeout "${WARM_TIMEOUT_S:-110}" "$PY" -m benchmarks.bench_aggregation_variants --warm "$g" "${ARGS[@]}" \
    > "$WORK/warm_$i.log" 2>&1 &
done
wait
echo "warm+tests $SECONDS s" | tee -a "$WORK/summary.txt"
tail -n 2 "$WORK"/test_*.log
run variants "${VARIANTS_TIMEOUT_S:-150}" "$PY" -m benchmarks.bench_aggregation_variants --official --out "$WORK" \
  --graphs "$GRAPHS" "${ARGS[@]}"
if [ "${NCU:-1}" = 1 ] && command -v ncu > /dev/null; then
  run ncu "${NCU_TIMEOUT_S:-45}" ncu --profile-from-start off --clock-control none --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --metrics lts__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum \
    "$PY" -m benchmarks.bench_aggregation_variants --profile
fi
grep -h "^|\|^- geomean\|^- _multi" "$WORK"/aggregation-*.md 2>/dev/null
mkdir -p "$OUT"
cp "$WORK/summary.txt" "$OUT/summary.txt"
tar czf "$OUT/variants.tgz" -C "$WORK" .
exit 0
