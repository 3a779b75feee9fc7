#!/usr/bin/env bash
# The Triton launch path's GPU check in one device call: the gather-scatter Triton tests and the op
# parity and CSR tests on CUDA (in parallel, with the C++ graph extension building beside them), then
# bench_gpu_overhead on a baseline tree and on this one (this tree's benchmark script, each tree's
# gnnfuse), alternating, PAIRS times (default 1), on a quiet machine. From this tree's root on a CUDA machine:
#   BASE=/path/to/baseline/tree PAIRS=2 OUT=/some/dir bash benchmarks/gpu/launch_path.sh
# Everything lands in $OUT/launch_path.tgz, with $OUT/summary.txt.
set -uo pipefail
source "${BASH_SOURCE%/*}/lib.sh"
HERE="$PWD"
export PYTHONPATH="$HERE"
gpu_header
build_extensions "${BUILD_LIMIT_S:-150}" graph > /dev/null &
step tests_triton "${TESTS_LIMIT_S:-170}" "$PY" -m pytest -q -p no:cacheprovider -rfE --durations=8 \
  tests/test_triton_gather_scatter.py &
step tests_parity "${TESTS_LIMIT_S:-170}" "$PY" -m pytest -q -p no:cacheprovider -rfE --durations=8 tests/test_op_parity.py \
  tests/test_csr.py &
wait
for pair in $(seq 1 "${PAIRS:-1}"); do  # before, after, before, after, ...: one process each
  if [ -n "${BASE:-}" ]; then
    (cd "$BASE" && export PYTHONPATH="$BASE" && step "bench_base$pair" 90 "$PY" "$HERE/benchmarks/bench_gpu_overhead.py" \
       --widths "${WIDTHS:-32,128}" --out "$W/base$pair")
  fi
  step "bench_this$pair" 90 "$PY" benchmarks/bench_gpu_overhead.py --widths "${WIDTHS:-32,128}" --out "$W/this$pair"
done
for f in "$W"/tests_*.log; do echo "$(basename "$f"): $(tail -n 1 "$f")" >> "$W/summary.txt"; done
pack launch_path
