#!/usr/bin/env bash
# One GPU session in one call: build, the whole test suite on CUDA, then the GPU benchmarks.
# From the repo root on a CUDA machine:
#   PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/validate.sh [STEP ...]
# STEPs (default: tests planarity structured): tests | planarity | structured | gather | locality | e2e | reorder |
# aggregation.
# GATHER_ARGS (e.g. "--graphs rfc-uniform,arxiv-like") goes to benchmarks.bench_gpu, E2E_ARGS (e.g.
# "--scale 0.5 --graphs community-products") to bench_e2e, REORDER_ARGS to bench_reorder.
# Each step has its own timeout and writes its results and log (<step>.log) into a work folder; a
# step that fails or times out does not stop the next one. At the end everything is packed into
# $OUT/results.tgz (the device tool brings back only a few files), next to $OUT/summary.txt. Budgets on an H100 host: build ~1.5 min,
# tests <= 7 min, planarity ~1 min, structured ~4 min (torch.compile anchors), gather <= 5.5 min, locality ~3 min, e2e and reorder up to 9 min each.
set -uo pipefail
source "${BASH_SOURCE%/*}/lib.sh"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests planarity structured)
gpu_header
build_extensions 240 > /dev/null

for step in "${steps[@]}"; do
  case "$step" in
    tests) step tests "${TESTS_TIMEOUT_S:-420}" "$PY" -m pytest tests -q -p no:cacheprovider --maxfail=25 --durations=15 ;;
    planarity) step planarity 120 "$PY" -m benchmarks.bench_planarity --device cuda --no-compile --out "$W" ;;
    structured) step structured 330 "$PY" -m benchmarks.bench_structured_scatter --device cuda --out "$W" ;;
    gather) step gather "${GATHER_TIMEOUT_S:-340}" "$PY" -m benchmarks.bench_gpu --out "$W" \
              --budget-s "${GATHER_BUDGET_S:-280}" ${GATHER_ARGS:-} ;;
    locality) step locality 400 "$PY" -m benchmarks.bench_gpu_locality --out "$W" ;;
    e2e) step e2e "${E2E_TIMEOUT_S:-540}" "$PY" -m benchmarks.bench_e2e --device cuda --out "$W" ${E2E_ARGS:-} ;;
    reorder) step reorder "${REORDER_TIMEOUT_S:-540}" "$PY" -m benchmarks.bench_reorder --device cuda --out "$W" \
               ${REORDER_ARGS:-} ;;
    aggregation) step aggregation "${AGG_TIMEOUT_S:-200}" "$PY" -m benchmarks.bench_aggregation --device cuda --rounds 5 --out "$W" ${AGG_ARGS:-} ;;
    *) echo "unknown step $step" | tee -a "$W/summary.txt" ;;
  esac
done
tail -n 3 "$W"/tests.log 2>/dev/null
pack results
exit 0
