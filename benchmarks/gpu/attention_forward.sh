#!/usr/bin/env bash
# The attention forward kernels' GPU call: the compiled-kernel check of every attention op
# (check_attention.py) while 8 processes compile every benchmarked kernel (and the C++ graph
# extension builds for the tests); then, with the GPU to itself, the forward kernel bench against
# our sum (attention_forward.py) at 8 x 8 and 4 x 64 on arxiv-like and rfc-uniform, each width with
# its own variants (FWD_VARIANTS_8, FWD_VARIANTS_64: comma-separated, see attention_forward.py;
# default: the shipped forward alone). FWD_CHECK_AHEAD: the forward load orders check_attention.py
# runs (space-separated attention.FORWARD_AHEAD values). Last, the CUDA attention tests, for
# FWD_TESTS_S seconds (0: none).
# From the repo root on a CUDA machine:  PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/attention_forward.sh
# Everything lands in $OUT/attention_forward.tgz next to $OUT/summary.txt.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
V8="${FWD_VARIANTS_8:-default}" V64="${FWD_VARIANTS_64:-default}" GRAPHS="${FWD_GRAPHS:-arxiv-like,rfc-uniform}"
BENCH=("$PY" benchmarks/gpu/attention_forward.py --graphs "$GRAPHS" --layers gat,gatv2,dot --rounds "${FWD_ROUNDS:-15}")
gpu_header
# FWD_CHECK_AHEAD: the forward load orders to check (attention.FORWARD_AHEAD values; default: the shipped one)
step check "${FWD_CHECK_S:-150}" bash -c 'for a in ${FWD_CHECK_AHEAD:-default}; do
  if [ "$a" = default ]; then "$0" benchmarks/gpu/check_attention.py; else "$0" benchmarks/gpu/check_attention.py --ahead "$a"; fi || exit 1
done' "$PY" &
[ "${FWD_TESTS_S:-0}" -gt 0 ] && build_extensions 240 graph &  # for the tests, which run after the bench
step warm8 "${FWD_WARM_S:-150}" "${BENCH[@]}" --widths 8x8 --variants "$V8" --warm 8 --compile-only
step warm64 "${FWD_WARM_S:-150}" "${BENCH[@]}" --widths 4x64 --variants "$V64" --warm 8 --compile-only
wait
step bench8 "${FWD_BENCH_S:-120}" "${BENCH[@]}" --widths 8x8 --variants "$V8" --out "$W/fwd-8x8.md"
pack attention_forward  # (again below: what ran so far comes back if the call is cut short)
step bench64 "${FWD_BENCH_S:-120}" "${BENCH[@]}" --widths 4x64 --variants "$V64" --out "$W/fwd-4x64.md"
pack attention_forward
step tests "${FWD_TESTS_S:-0}" "$PY" -m pytest -q -p no:cacheprovider tests/test_attention_forward.py tests/test_pair_attention.py \
  tests/test_attention.py -k "${FWD_TEST_K:-triton or hub or row_groups or one_pass}"
tail -n 3 "$W/check.log" "$W/tests.log" 2>/dev/null
grep -h -E "^\| (arxiv|rfc)" "$W"/fwd-*.md 2>/dev/null | cut -c1-200
pack attention_forward
exit 0
