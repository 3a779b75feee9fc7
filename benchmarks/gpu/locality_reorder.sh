#!/usr/bin/env bash
# Reorder cost and the three-order locality numbers on the GPU in one device call, from the repo
# root on a CUDA machine:
#   PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/locality_reorder.sh
# 1. bench_reorder on community-products at F = 128 (reorder cost, CSR rebuild, forwards of ours and
#    cuSPARSE, 2-layer GCN epochs, break-even epochs), methods $METHODS, with Triton's on-disk cache
#    empty (a fresh TRITON_CACHE_DIR unless the caller sets one): the first method's first call is a
#    bare machine's first gnnfuse call;
# 2. bench_reorder --reorder-only --phases in a second process, now that Triton's on-disk cache holds
#    the kernels the first process compiled: the steps of community-refined timed one by one on its
#    first and second call, then each method's calls;
# 3. with DIAG=1: the first call traced op by op in a fresh process, and again after two GCN epochs (what a
#    reorder adds to a training process: only the kernels training does not load anyway);
#    the reorder tests of the GPU vote kernel (tests/test_ordering.py -k triton; no C++ needed);
# 4. bench_gpu_locality: the realistic graphs in three orders (as generated, scrambled, after
#    gnnfuse.reorder "auto") at F = 32..256, ours vs cuSPARSE (stress graphs: locality.sh); SKIP_LOCALITY=1 skips it.
# Nothing here needs the C++ extensions on CUDA, so none is built (no host CPU load during the
# timings). Results, logs and summary land in $OUT (results.tgz holds everything).
set -uo pipefail
source "${BASH_SOURCE%/*}/lib.sh"
gpu_header
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$(mktemp -d)}"
step reorder "${REORDER_TIMEOUT_S:-150}" "$PY" -m benchmarks.bench_reorder --device cuda --graphs community-products \
  --width 128 --methods "${METHODS:-auto,community}" --out "$W" --tag "${TAG:-}"
step reorder_second_process "${SECOND_TIMEOUT_S:-60}" "$PY" -m benchmarks.bench_reorder --device cuda \
  --graphs community-products --methods "${METHODS:-auto,community}" --reorder-only --phases
grep -E "phases|reorder .* s \(first call" "$W/reorder_second_process.log" | sed 's/^/second process:/' | tee -a "$W/summary.txt"
if [ "${DIAG:-0}" = 1 ]; then  # where a first call's time goes: per-op first-use cost, then after training's kernels
  step reorder_op_trace 45 "$PY" -m benchmarks.bench_reorder --device cuda --graphs community-products --methods auto \
    --reorder-only --op-trace
  step reorder_after_epoch 60 "$PY" -m benchmarks.bench_reorder --device cuda --graphs community-products --methods auto \
    --reorder-only --after-epoch --op-trace
  grep -hE "op trace|first call|after two" "$W/reorder_op_trace.log" "$W/reorder_after_epoch.log" | cut -c1-900 \
    | tee -a "$W/summary.txt"
fi
step tests_cuda "${TESTS_TIMEOUT_S:-120}" "$PY" -m pytest tests/test_ordering.py -q -p no:cacheprovider -k triton
tail -n 1 "$W/tests_cuda.log" | tee -a "$W/summary.txt"
if [ "${SKIP_LOCALITY:-0}" != 1 ]; then
  step locality "${LOCALITY_TIMEOUT_S:-170}" "$PY" -m benchmarks.bench_gpu_locality \
    --graphs "${GRAPHS:-community-products,rmat-products,mesh-products}" --stress "" \
    --widths 32,64,128,256 --variants auto,cusparse --rounds "${ROUNDS:-8}" --out "$W"
fi
pack results "$W"/*.md
grep -E "^\| community-products" "$W"/reorder_*.md | cut -c1-400
grep -E "^- " "$W"/gpu-locality_*.md 2>/dev/null | cut -c1-220
exit 0
