#!/usr/bin/env bash
# planarity_nll on a CUDA machine: the test file (CUDA + CPU) and the CUDA benchmark.
# Run from the repo root:  PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/planarity.sh
# Writes exactly two files: $OUT/planarity_gpu.md (test summary + benchmark table) and
# $OUT/planarity_gpu.json (raw benchmark rows). Budget: under 3 minutes on an H100
# (most of it Triton JIT compiles: one kernel per plane size, dtype and direction).
set -u
: "${OUT:?set OUT to the output directory}"
PY="${PYTHON:-python}"
mkdir -p "$OUT"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

start=$(date +%s)
timeout 85 "$PY" -m pytest tests/test_planarity.py -q -p no:cacheprovider > "$tmp/tests.log" 2>&1
test_rc=$?
test_s=$(( $(date +%s) - start ))

start=$(date +%s)
# torch.compile of the reference is skipped on GPU (its compiles alone would take most of the budget)
timeout 85 "$PY" -m benchmarks.bench_planarity --device cuda --no-compile --out "$tmp" > "$tmp/bench.log" 2>&1
bench_rc=$?
bench_s=$(( $(date +%s) - start ))

{
  echo "# planarity_nll on GPU"
  echo
  echo "## tests/test_planarity.py (rc=$test_rc, ${test_s}s)"
  echo
  echo '```'
  tail -n 30 "$tmp/tests.log"
  echo '```'
  echo
  echo "## benchmark (rc=$bench_rc, ${bench_s}s)"
  echo
  md=$(ls "$tmp"/planarity_*.md 2>/dev/null | head -n 1)
  if [ -n "$md" ]; then sed 's/^# /### /' "$md"; else echo '```'; tail -n 40 "$tmp/bench.log"; echo '```'; fi
} > "$OUT/planarity_gpu.md"
json=$(ls "$tmp"/planarity_*.json 2>/dev/null | head -n 1)
if [ -n "$json" ]; then cp "$json" "$OUT/planarity_gpu.json"; fi
cat "$OUT/planarity_gpu.md"
exit $(( test_rc != 0 || bench_rc != 0 ))
