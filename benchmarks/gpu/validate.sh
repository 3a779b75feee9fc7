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
: "${OUT:?set OUT to the output directory}"
export PYTHONPATH="${PYTHONPATH:-.}"
PY="${PYTHON:-python}"
FINAL="$OUT"
OUT="$(mktemp -d)"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests planarity structured)

run() {  # run STEP TIMEOUT_S CMD...: logs to $OUT/STEP.log, records rc and seconds in $OUT/summary.txt
  local step=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$step.log" 2>&1
  local rc=$?
  echo "$step rc=$rc ${limit}s-limit $((SECONDS - start))s" | tee -a "$OUT/summary.txt"
}

# every C++ extension, in parallel (each has its own build lock)
export MAX_JOBS="${MAX_JOBS:-16}"
for ext in $("$PY" -c "from gnnfuse._build_cache import EXTENSIONS; print(*EXTENSIONS)"); do
  timeout 240 "$PY" -c "from gnnfuse._build import load_extension; load_extension('$ext')" > "$OUT/build_$ext.log" 2>&1 &
done
wait
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"

for step in "${steps[@]}"; do
  case "$step" in
    tests) run tests "${TESTS_TIMEOUT_S:-420}" "$PY" -m pytest tests -q -p no:cacheprovider --maxfail=25 --durations=15 ;;
    planarity) run planarity 120 "$PY" -m benchmarks.bench_planarity --device cuda --no-compile --out "$OUT" ;;
    structured) run structured 330 "$PY" -m benchmarks.bench_structured_scatter --device cuda --out "$OUT" ;;
    gather) run gather "${GATHER_TIMEOUT_S:-340}" "$PY" -m benchmarks.bench_gpu --out "$OUT" \
              --budget-s "${GATHER_BUDGET_S:-280}" ${GATHER_ARGS:-} ;;
    locality) run locality 400 "$PY" -m benchmarks.bench_gpu_locality --out "$OUT" ;;
    e2e) run e2e "${E2E_TIMEOUT_S:-540}" "$PY" -m benchmarks.bench_e2e --device cuda --out "$OUT" ${E2E_ARGS:-} ;;
    reorder) run reorder "${REORDER_TIMEOUT_S:-540}" "$PY" -m benchmarks.bench_reorder --device cuda --out "$OUT" \
               ${REORDER_ARGS:-} ;;
    aggregation) run aggregation "${AGG_TIMEOUT_S:-200}" "$PY" -m benchmarks.bench_aggregation --device cuda --rounds 5 --out "$OUT" ${AGG_ARGS:-} ;;
    *) echo "unknown step $step" | tee -a "$OUT/summary.txt" ;;
  esac
done
tail -n 3 "$OUT"/tests.log 2>/dev/null
mkdir -p "$FINAL"
cp "$OUT/summary.txt" "$FINAL/summary.txt"
tar czf "$FINAL/results.tgz" -C "$OUT" .
exit 0
