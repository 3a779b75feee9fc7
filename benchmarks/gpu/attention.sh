#!/usr/bin/env bash
# The attention work's GPU session in one call: the compiled-kernel check of every attention op
# against the reference (check_attention.py) and the CUDA tests of the attention ops and layers
# (Triton backends: GAT, multi-head edge weights, GATv2/Transformer with edge features, hub splitting,
# row groups, the launch count per training step) while the C++ graph extension builds; then, with
# the GPU to themselves, where a call's and a step's time goes (profile_attention.py, when
# ATT_PROFILE_S > 0), the step's memory timeline (attention_memory.py), the tile sweep, and the
# training-step benchmark vs PyG (with and without edge features; products-like in its own folder
# when ATT_PRODUCTS_S > 0).
# From the repo root on a CUDA machine:  PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/attention.sh
# Everything lands in $OUT/attention.tgz next to $OUT/summary.txt. A step given 0 seconds is skipped
# (e.g. ATT_TESTS_S=0; ATT_BUILD_S=0: no C++ build, for a call that runs no test); ATT_BENCH_ARGS adds
# arguments to the benchmark (e.g. --separate-projections).
set -uo pipefail
source "$(dirname "$0")/lib.sh"
GRAPHS="${ATT_GRAPHS:-arxiv-like,community-arxiv}"   # the training-step benchmark's suite graphs
EDGE_GRAPHS="${ATT_EDGE_GRAPHS-arxiv-like}"           # with edge features (empty: skipped)
SWEEP_LAYERS="${ATT_SWEEP_LAYERS:-GATConv,GATv2Conv,TransformerConv}" SWEEP="${ATT_SWEEP:-BE4W2,BE4W1,BE8W1}"
gpu_header
# the C++ graph extension (CPU-side CSR builds in the tests; a test that needs it first waits on its
# build lock), the check and the tests side by side; nothing is timed until all three are done
[ "${ATT_BUILD_S:-240}" -gt 0 ] && MAX_JOBS="${MAX_JOBS:-16}" build_extensions "${ATT_BUILD_S:-240}" graph &
step check "${ATT_CHECK_S:-90}" "$PY" benchmarks/gpu/check_attention.py ${ATT_CHECK_CASE:+--case "$ATT_CHECK_CASE"} &
step tests "${ATT_TESTS_S:-150}" "$PY" -m pytest -q -p no:cacheprovider --durations=8 tests/test_attention.py \
  tests/test_attention_head_weights.py tests/test_pair_attention.py tests/test_pair_attention_layers.py \
  tests/test_attention_launches.py -k "${ATT_TEST_K:-triton or hub or edge_features or row_groups or launch}" &
wait
step profile "${ATT_PROFILE_S:-0}" "$PY" benchmarks/gpu/profile_attention.py --out "$W" ${ATT_PROFILE_ARGS:-}
step memory "${ATT_MEMORY_S:-40}" "$PY" benchmarks/gpu/attention_memory.py
step sweep "${ATT_SWEEP_S:-100}" "$PY" -m benchmarks.bench_attention --device cuda --layers "$SWEEP_LAYERS" \
  --graphs arxiv-like --edge-blocks "$SWEEP" --rounds 5 --out "$W"
for graph in ${GRAPHS//,/ }; do  # one result file per graph (a step cut short loses only its own rows)
  mkdir -p "$W/$graph"
  step "bench_$graph" "${ATT_BENCH_S:-120}" "$PY" -m benchmarks.bench_attention --device cuda \
    --layers GATConv,GATv2Conv,TransformerConv --graphs "$graph" --rounds "${ATT_ROUNDS:-5}" --out "$W/$graph" \
    ${ATT_BENCH_ARGS:-}
done
[ -n "$EDGE_GRAPHS" ] && step bench_edge "${ATT_EDGE_S:-60}" "$PY" -m benchmarks.bench_attention --device cuda \
  --layers GATv2Conv,TransformerConv --graphs "$EDGE_GRAPHS" --edge-dim 8 --rounds 5 --out "$W"
mkdir -p "$W/products"  # same file name as the main benchmark's: a folder of its own
step bench_products "${ATT_PRODUCTS_S:-0}" "$PY" -m benchmarks.bench_attention --device cuda \
  --layers GATConv,GATv2Conv,TransformerConv --graphs products-like --rounds "${ATT_PRODUCTS_ROUNDS:-3}" --out "$W/products"
tail -n 3 "$W/check.log" "$W/tests.log" 2>/dev/null
grep -E "^### step|^## " "$W/attention-profile.txt" 2>/dev/null
grep -E "^[A-Z]|peak" "$W/memory.log" 2>/dev/null | head -40
cat "$W"/attention*.md "$W"/*/attention*.md 2>/dev/null | grep -E "^\|" | cut -c1-460
pack attention
exit 0
