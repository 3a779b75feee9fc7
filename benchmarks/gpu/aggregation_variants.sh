#!/usr/bin/env bash
# The multi-aggregation forward's settings in one GPU call (benchmarks/bench_aggregation_variants.py):
# the graphs' kernels compiled in parallel processes (Triton's disk cache) while the multi-aggregation
# tests run on CUDA (with TEST_TUNING as the default setting); then the interleaved timings, the public op
# and bench_aggregation's multi table (the fastest setting at F=64 as the default), and (NCU=1) ncu sections
# of sum vs multi on arxiv-like F=64. Everything lands in $OUT/variants.tgz next to $OUT/summary.txt.
#   PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/aggregation_variants.sh
# VARIANTS / SIDE_VARIANTS: the settings timed at F=64 / at F=32 and 128 (names in the script's variants());
# GRAPHS: comma-separated. BUILD=0: no C++ build (then TEST_K should leave the CPU-tensor cases out, e.g.
# TEST_K="multi and not compile_fullgraph"). Budget on an H100 host: about 4 minutes with every graph and the
# build (each step has a timeout); 75 s for four graphs without build or ncu.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
TEST_TUNING="${TEST_TUNING:-Tuning()}"
GRAPHS="${GRAPHS:-arxiv-like (power-law),products-like (uniform),community-arxiv,rmat-arxiv,community-products,rmat-products}"
ARGS=(--variants "${VARIANTS:-current,combine1,seg512,seg256,out_first}" --side-variants "${SIDE_VARIANTS:-current,combine1,seg512}")
gpu_header
# the C++ extensions (the tests' CPU-tensor cases) build while the first GPU tests run
[ "${BUILD:-1}" = 1 ] && MAX_JOBS="${MAX_JOBS:-8}" build_extensions 200 graph aggregate &
for part in tests/test_multi_aggregate.py tests/test_op_parity.py; do
  step "$(basename "$part" .py)" "${TESTS_TIMEOUT_S:-170}" "$PY" -c "import sys, pytest; import gnnfuse.triton.multi_aggregate as M
M.DEFAULT_TUNING = M.$TEST_TUNING
print('default tuning', M.DEFAULT_TUNING, flush=True)
sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--maxfail=10', '$part', '-k', '${TEST_K:-multi}']))" &
done
i=0
IFS=, read -ra graph_list <<< "$GRAPHS"
for g in "${graph_list[@]}"; do
  i=$((i + 1))
  timeout "${WARM_TIMEOUT_S:-110}" "$PY" -m benchmarks.bench_aggregation_variants --warm "$g" "${ARGS[@]}" \
    > "$W/warm_$i.log" 2>&1 &
done
wait
echo "warm+tests ${SECONDS}s" | tee -a "$W/summary.txt"
tail -n 2 "$W"/test_*.log
step variants "${VARIANTS_TIMEOUT_S:-150}" "$PY" -m benchmarks.bench_aggregation_variants --official --out "$W" \
  --graphs "$GRAPHS" "${ARGS[@]}"
if [ "${NCU:-1}" = 1 ] && command -v ncu > /dev/null; then
  step ncu "${NCU_TIMEOUT_S:-45}" ncu --profile-from-start off --clock-control none --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --metrics lts__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum \
    "$PY" -m benchmarks.bench_aggregation_variants --profile
fi
grep -h "^|\|^- geomean\|^- _multi" "$W"/aggregation-*.md 2>/dev/null
pack variants
exit 0
