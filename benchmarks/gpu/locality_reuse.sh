#!/usr/bin/env bash
# Reuse of source rows inside an SM, in one device call (no C++ build: Triton and torch only): a
# SWEEP_SET of bench_gpu_locality ("reuse": narrower feature tiles, larger row groups; "evict": the
# default without its evict_last hint) on the reordered realistic graphs, the uniform-source stress
# graphs and the L2-resident-sources ceiling, interleaved with the auto plan and cuSPARSE; then
# Nsight Compute counters of the auto plan and NCU_PLANS at F=128; then the CUDA schedule tests.
# From the repo root on a CUDA machine:
#   PYTHONPATH=. OUT=/some/dir [SWEEP_SET=reuse|evict] [GRAPHS=a,b] [STRESS=c] [WIDTHS=64,128] [NCU_PLANS="gbf32,big"] \
#     [TESTS="pytest args"] bash benchmarks/gpu/locality_reuse.sh
# (SWEEP_SET=evict: the default against itself without its evict_last hint, before/after in one call.)
set -uo pipefail
source "${BASH_SOURCE%/*}/lib.sh"
gpu_header
step reuse "${SWEEP_TIMEOUT_S:-280}" "$PY" -m benchmarks.bench_gpu_locality \
  --graphs "${GRAPHS:-community-products,rmat-products,mesh-products}" --orders "${ORDERS:-reordered}" \
  --stress "${STRESS:-products-like,hub-stress,arxiv-like}" --widths "${WIDTHS:-64,128,256}" --sweep "${SWEEP_SET:-reuse}" \
  --l2-ceiling --variants auto,cusparse --rounds "${ROUNDS:-7}" --out "$W" --name "gpu-locality-${SWEEP_SET:-reuse}"
if [ -n "${NCU_PLANS-gbf32,big}" ]; then
  step ncu "${NCU_TIMEOUT_S:-100}" ncu --profile-from-start off --clock-control none \
    -k "regex:rowgroup|csr_fwd|one_pass" --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy --section LaunchStats "$PY" -m benchmarks.gpu.profile_gather --width 128 \
    --plans "${NCU_PLANS-gbf32,big}"
  grep -E "^== |L1/TEX Hit|L2 Hit|L2 Cache Throughput|DRAM Throughput|Duration|Achieved Occupancy|Registers Per" \
    "$W/ncu.log" | cut -c1-140 > "$W/ncu_summary.txt"
fi
step tests "${TESTS_TIMEOUT_S:-120}" "$PY" -m pytest -q -p no:cacheprovider \
  ${TESTS:-tests/test_triton_schedule.py tests/test_triton_gather_scatter.py}
tail -n 2 "$W/tests.log" | tee -a "$W/summary.txt"
pack results "$W"/*.md
cat "$W/ncu_summary.txt" 2>/dev/null | head -60
grep -E "^\| " "$W"/gpu-locality-*.md | cut -d'|' -f2-7,11,12,19- | cut -c1-400
exit 0
