#!/usr/bin/env bash
# PNAConv's memory and speed in one GPU call: the step of every variant against PyG's, interleaved
# (benchmarks/bench_pna.py; BEFORE=path/to/another/_pna.py adds that version as "before"), the
# per-operator memory log of the default layer and of feature chunks (benchmarks/pna_memory.py,
# MEMORY_CHUNKS, default "none 32 16"), then the PNA tests on CUDA.
#   PYTHONPATH=. OUT=/some/dir [BEFORE=old_pna.py] [SUFFIX=_2026-11-23_x] bash benchmarks/gpu/pna.sh
# The C++ extensions the tests' CPU references need build in the background on 8 jobs while the
# benchmarks run. Everything lands in $OUT/pna.tgz next to $OUT/summary.txt.
# Budget on an H100 host: about 4 minutes (the builds take about 85 s, the tests up to 4 minutes
# with Triton's first compiles of their float64 kernels).
set -uo pipefail
source "$(dirname "$0")/lib.sh"
gpu_header
MAX_JOBS="${MAX_JOBS:-8}" build_extensions 240 graph aggregate &
before=()
[ -n "${BEFORE:-}" ] && before=(--before "$BEFORE")
step bench "${BENCH_TIMEOUT_S:-150}" "$PY" -m benchmarks.bench_pna --device cuda --rounds "${ROUNDS:-10}" \
  --suffix "${SUFFIX:-}" --out "$W" "${before[@]}"
for chunk in ${MEMORY_CHUNKS:-none 32 16}; do
  step "memory_$chunk" 60 "$PY" -m benchmarks.pna_memory --device cuda --nodes 170000 --edges 1170000 --chunk "$chunk" \
    --top 30
done
wait
step tests "${TESTS_TIMEOUT_S:-240}" "$PY" -m pytest -q -p no:cacheprovider --maxfail=10 tests/test_aggr_pna.py
tail -n 3 "$W/tests.log"
grep -h "^|" "$W"/aggregation-pna*.md 2>/dev/null
grep -h "^forward\|^backward" "$W"/memory_*.log 2>/dev/null
pack pna
exit 0
