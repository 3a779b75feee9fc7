#!/usr/bin/env bash
# Reorder cost and the three-order locality numbers on the GPU in one device call, from the repo
# root on a CUDA machine:
#   PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/locality_reorder.sh
# 1. bench_reorder on community-products at F = 128 (reorder cost, CSR rebuild, forwards of ours and
#    cuSPARSE, 2-layer GCN epochs, break-even epochs), methods $METHODS;
# 2. bench_reorder --reorder-only in a second process: its first reorder call, now that Triton's
#    on-disk cache holds the kernels the first process compiled (what every later process pays);
# 3. bench_gpu_locality: the realistic graphs in three orders (as generated, scrambled, after
#    gnnfuse.reorder "auto") at F = 32..256, ours vs cuSPARSE (stress graphs: locality.sh).
# Nothing here needs the C++ extensions on CUDA, so none is built (no host CPU load during the
# timings). Results, logs and summary land in $OUT (results.tgz holds everything).
set -uo pipefail
source "${BASH_SOURCE%/*}/lib.sh"
gpu_header
step reorder "${REORDER_TIMEOUT_S:-150}" "$PY" -m benchmarks.bench_reorder --device cuda --graphs community-products \
  --width 128 --methods "${METHODS:-auto,community}" --out "$W" --tag "${TAG:-}"
step reorder_second_process "${SECOND_TIMEOUT_S:-60}" "$PY" -m benchmarks.bench_reorder --device cuda \
  --graphs community-products --methods "${METHODS:-auto,community}" --reorder-only
grep -E "reorder .* s \(first call" "$W/reorder_second_process.log" | sed 's/^/second process:/' | tee -a "$W/summary.txt"
if [ "${SKIP_LOCALITY:-0}" != 1 ]; then
  step locality "${LOCALITY_TIMEOUT_S:-170}" "$PY" -m benchmarks.bench_gpu_locality \
    --graphs "${GRAPHS:-community-products,rmat-products,mesh-products}" --stress "" \
    --widths 32,64,128,256 --variants auto,cusparse --rounds "${ROUNDS:-8}" --out "$W"
fi
pack results "$W"/*.md
grep -E "^\| community-products" "$W"/reorder_*.md | cut -c1-400
grep -E "^- " "$W"/gpu-locality_*.md 2>/dev/null | cut -c1-220
exit 0
