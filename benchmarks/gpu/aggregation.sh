#!/usr/bin/env bash
# The aggregation work (multi-aggregation, scatter, PNAConv) in one GPU call: the kernel-only plan
# timings, bench_aggregation (multi, scatter, pna), then the aggregation tests on CUDA.
#   PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/aggregation.sh
# The C++ extensions the tests' CPU-tensor cases need build in the background while the benchmarks
# run (they need none). Everything lands in $OUT/aggregation.tgz next to $OUT/summary.txt.
# Budget on an H100/H200 host: about 4 minutes.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
export MAX_JOBS="${MAX_JOBS:-16}"
gpu_header
build_extensions 240 graph aggregate &
step plans "${PLANS_TIMEOUT_S:-60}" "$PY" benchmarks/bench_aggregation_plans.py --quick
step bench "${AGG_TIMEOUT_S:-200}" "$PY" -m benchmarks.bench_aggregation --device cuda --rounds 5 --out "$W"
wait
step tests "${TESTS_TIMEOUT_S:-180}" "$PY" -m pytest -q -p no:cacheprovider --maxfail=10 tests/test_multi_aggregate.py \
  tests/test_scatter_api.py tests/test_aggr_pna.py
tail -n 3 "$W/tests.log"
grep -h "^|\|^- geomean" "$W"/aggregation-*.md 2>/dev/null
pack aggregation
exit 0
