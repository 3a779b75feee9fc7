#!/usr/bin/env bash
# GPU run of gnnfuse.structured_scatter_add (issue 4). From the repo root, on a CUDA machine:
#   PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/structured_scatter.sh
# Runs the test file on CUDA, then the CUDA benchmark plus the host CPU's thread scaling
# (1, 2, 4, 8, 16 threads) in one benchmark run. Writes exactly two files into $OUT:
# structured_scatter_<gpu>_<date>.json and .md (the pytest summary is appended to the .md).
# Budget: under 4 minutes on an H100 host (C++ builds ~1 min on a fresh machine, in parallel;
# tests ~30 s; benchmark ~1.5 min). Each step has a timeout; the benchmark gets what is left of ~230 s.
set -uo pipefail
: "${OUT:?set OUT to the output directory}"
export PYTHONPATH="${PYTHONPATH:-.}"
PY="${PYTHON:-python}"
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
mkdir -p "$OUT"

# build both C++ extensions the tests use, in parallel (each has its own lock)
timeout 150 "$PY" -c "from gnnfuse._build import load_extension; load_extension('density')" &
timeout 150 "$PY" -c "from gnnfuse._build import load_extension; load_extension('graph')" &
wait

log=$(mktemp)
timeout 90 "$PY" -m pytest tests/test_structured_scatter.py -q -p no:cacheprovider 2>&1 | tee "$log"
test_rc=${PIPESTATUS[0]}

left=$(( 230 - SECONDS )); [ "$left" -lt 60 ] && left=60  # keep the whole script near 4 minutes
timeout "$left" "$PY" -m benchmarks.bench_structured_scatter --device cuda --threads 1,2,4,8,16 --out "$OUT"
bench_rc=$?

md=$(ls -t "$OUT"/structured_scatter_*.md 2>/dev/null | head -1)
if [ -n "$md" ]; then
  {
    echo
    echo "## pytest tests/test_structured_scatter.py on $(hostname) (exit $test_rc)"
    echo
    echo '```'
    tail -n 15 "$log"
    echo '```'
  } >> "$md"
fi
echo "tests exit $test_rc, benchmark exit $bench_rc"
exit $(( test_rc != 0 || bench_rc != 0 ))
