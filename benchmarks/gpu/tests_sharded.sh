#!/usr/bin/env bash
# The whole test suite on one GPU host in SHARDS parallel pytest processes (test files dealt round-robin),
# each with its own log and failure summary under $OUT: a suite that takes ~10 min serially on an H100
# host fits in one device call. From the repo root: PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/tests_sharded.sh [PYTEST_ARGS...]
set -uo pipefail
: "${OUT:?set OUT to the output directory}"
export PYTHONPATH="${PYTHONPATH:-.}"
PY="${PYTHON:-python}"
SHARDS="${SHARDS:-4}"
LIMIT_S="${TESTS_TIMEOUT_S:-400}"
mapfile -t files < <(ls tests/test_*.py)
for ((s = 0; s < SHARDS; s++)); do
  shard=()
  for ((i = s; i < ${#files[@]}; i += SHARDS)); do shard+=("${files[$i]}"); done
  # each shard takes its share of the host's cores for the C++ kernels
  OMP_NUM_THREADS=$(( $(nproc) / SHARDS )) timeout "$LIMIT_S" "$PY" -m pytest -q -p no:cacheprovider -rfE \
    "$@" "${shard[@]}" > "$OUT/tests_shard$s.log" 2>&1 &
done
wait
for ((s = 0; s < SHARDS; s++)); do echo "shard $s: $(tail -n 1 "$OUT/tests_shard$s.log")"; done | tee "$OUT/tests_summary.txt"
grep -h "^FAILED\|^ERROR" "$OUT"/tests_shard*.log | tee -a "$OUT/tests_summary.txt"
