#!/usr/bin/env bash
# The GPU locality exploration in one device call (no C++ build needed: Triton and torch only):
# the SWEEP plans of bench_gpu_locality on community-products (generated + reordered), the
# products-like stress graph and the L2-resident-sources ceiling, then Nsight Compute counters of
# the auto plan and the sweep's candidates. From the repo root on a CUDA machine:
#   PYTHONPATH=. OUT=/some/dir [GRAPHS=a,b] [STRESS=c] [WIDTHS=64,128] [NCU_PLANS="2l,gw8"] bash benchmarks/gpu/locality_sweep.sh
set -uo pipefail
: "${OUT:?set OUT}"
export PYTHONPATH="${PYTHONPATH:-.}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python}"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
timeout "${SWEEP_TIMEOUT_S:-300}" "$PY" -m benchmarks.bench_gpu_locality --graphs "${GRAPHS:-community-products}" \
  --stress "${STRESS:-products-like}" --widths "${WIDTHS:-64,128,256}" --sweep --l2-ceiling --variants auto,cusparse \
  --rounds 7 --out "$OUT" --name gpu-locality-sweep > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"
timeout "${NCU_TIMEOUT_S:-150}" ncu --profile-from-start off --clock-control none -k "regex:rowgroup|csr_fwd|one_pass" \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
  --section LaunchStats "$PY" -m benchmarks.gpu.profile_gather --width 128 --plans "${NCU_PLANS:-2l}" > "$OUT/ncu.txt" 2>&1
echo "ncu rc=$?"
grep -E "^== |rowgroup|csr_fwd|Memory Throughput|L1/TEX Hit|L2 Hit|L2 Cache Throughput|DRAM Throughput|Duration|Achieved Occupancy|Registers Per|Theoretical Occ|Stall Long|Warp Cycles Per Issued|Mem Busy|Max Bandwidth|L1/TEX Cache Throughput" "$OUT/ncu.txt" | cut -c1-120 | head -150
tail -n 30 "$OUT/sweep.log" | cut -c1-400
