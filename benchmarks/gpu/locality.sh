#!/usr/bin/env bash
# The GPU locality measurement of record in one device call, from the repo root on a CUDA machine:
#   PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/locality.sh
# 1. bench_gpu_locality: the realistic graphs (community, R-MAT, mesh at products scale) in three
#    orders, the uniform-source stress graphs and the L2-resident-sources ceiling, F = 32..256,
#    our sum forward (the default dispatch) against cuSPARSE on the same ordered graph;
# 2. the plan sweep around the default (bench_gpu_locality --sweep) on community and R-MAT;
# 3. the CUDA tests of the gather-scatter kernels and their schedule.
# The C++ extensions (needed by the tests' CPU references) build on the CPUs while the GPU
# benchmarks run; the benchmarks interleave their variants, so the build's CPU load falls on all
# of them alike. Results, logs and summary land in $OUT (results.tgz holds everything).
set -uo pipefail
source "${BASH_SOURCE%/*}/lib.sh"
gpu_header
export MAX_JOBS="${MAX_JOBS:-12}"
build_extensions 300 > /dev/null &
build=$!
step locality "${LOCALITY_TIMEOUT_S:-300}" "$PY" -m benchmarks.bench_gpu_locality \
  --graphs "${GRAPHS:-community-products,rmat-products,mesh-products}" --stress "${STRESS:-arxiv-like,products-like,hub-stress}" \
  --widths 32,64,128,256 --l2-ceiling --variants auto,cusparse --rounds 10 --out "$W"
step sweep "${SWEEP_TIMEOUT_S:-150}" "$PY" -m benchmarks.bench_gpu_locality --graphs community-products,rmat-products \
  --stress "" --widths 64,128,256 --sweep --variants auto,cusparse --rounds 7 --out "$W" --name gpu-locality-sweep
wait "$build"
step tests "${TESTS_TIMEOUT_S:-300}" "$PY" -m pytest -q -p no:cacheprovider tests/test_triton_gather_scatter.py \
  tests/test_triton_schedule.py tests/test_gather_scatter.py tests/test_op_parity.py -k "gather_scatter or triton or schedule"
tail -n 3 "$W/tests.log" | tee -a "$W/summary.txt"
pack results "$W"/*.md
grep -E "^- " "$W"/gpu-locality_*.md | cut -c1-220
exit 0
