#!/usr/bin/env bash
# The attention work's GPU session in one call: the compiled-kernel check of every attention op
# against the reference (check_attention.py) next to the CUDA tests of the attention ops (Triton
# backends: GAT, multi-head edge weights, GATv2/Transformer with edge features, hub splitting, row
# groups), where a call's time goes (profile_attention.py, when ATT_PROFILE_S > 0), the step's memory
# timeline (attention_memory.py), the tile sweep, then the training-step
# benchmark vs PyG (with and without edge features; products-like in its own file when
# ATT_PRODUCTS_S > 0).
# From the repo root on a CUDA machine:  PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/attention.sh
# Logs and results land in $OUT (the device tool brings back at most 8 files: results are packed).
# A step given 0 seconds is skipped (e.g. ATT_TESTS_S=0).
set -uo pipefail
: "${OUT:?set OUT to the output directory}"
export PYTHONPATH="${PYTHONPATH:-.}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python}"
W="$(mktemp -d)"
GRAPHS="${ATT_GRAPHS:-arxiv-like,community-arxiv}"   # the training-step benchmark's suite graphs
EDGE_GRAPHS="${ATT_EDGE_GRAPHS-arxiv-like}"           # with edge features (empty: skipped)
SWEEP_LAYERS="${ATT_SWEEP_LAYERS:-GATConv,GATv2Conv,TransformerConv}" SWEEP="${ATT_SWEEP:-BE4W2,BE4W1,BE8W1}"
# the C++ graph extension (CPU-side CSR builds in the tests), built while the first steps run
MAX_JOBS=16 "$PY" -c "from gnnfuse._build import load_extension; load_extension('graph')" > "$W/build.log" 2>&1 &
BUILD=$!
step() {  # step NAME TIMEOUT_S CMD...
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  [ "$limit" -gt 0 ] || return 0
  timeout "$limit" "$@" > "$W/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - start))s" | tee -a "$W/summary.txt"
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$W/summary.txt"
# the check (no C++ extension needed) while the extension builds, then the tests (which need it); nothing
# is timed until both are done
step check "${ATT_CHECK_S:-90}" "$PY" benchmarks/gpu/check_attention.py ${ATT_CHECK_CASE:+--case "$ATT_CHECK_CASE"} &
CHECK=$!
wait "$BUILD"
step tests "${ATT_TESTS_S:-120}" "$PY" -m pytest -q -p no:cacheprovider --durations=8 tests/test_attention.py \
  tests/test_attention_head_weights.py tests/test_pair_attention.py tests/test_pair_attention_layers.py \
  -k "${ATT_TEST_K:-triton or hub or edge_features or row_groups}"
wait "$CHECK"
step profile "${ATT_PROFILE_S:-0}" "$PY" benchmarks/gpu/profile_attention.py --out "$W" ${ATT_PROFILE_ARGS:-}
step memory "${ATT_MEMORY_S:-40}" "$PY" benchmarks/gpu/attention_memory.py
step sweep "${ATT_SWEEP_S:-100}" "$PY" -m benchmarks.bench_attention --device cuda --layers "$SWEEP_LAYERS" \
  --graphs arxiv-like --edge-blocks "$SWEEP" --rounds 5 --out "$W"
step bench "${ATT_BENCH_S:-200}" "$PY" -m benchmarks.bench_attention --device cuda --layers GATConv,GATv2Conv,TransformerConv \
  --graphs "$GRAPHS" --rounds 5 --out "$W"
[ -n "$EDGE_GRAPHS" ] && step bench_edge "${ATT_EDGE_S:-60}" "$PY" -m benchmarks.bench_attention --device cuda \
  --layers GATv2Conv,TransformerConv --graphs "$EDGE_GRAPHS" --edge-dim 8 --rounds 5 --out "$W"
mkdir -p "$W/products"  # same file name as the main benchmark's: a folder of its own
step bench_products "${ATT_PRODUCTS_S:-0}" "$PY" -m benchmarks.bench_attention --device cuda \
  --layers GATConv,GATv2Conv,TransformerConv --graphs products-like --rounds "${ATT_PRODUCTS_ROUNDS:-3}" --out "$W/products"
tail -n 3 "$W/check.log" "$W/tests.log" 2>/dev/null
cat "$W/memory.log" 2>/dev/null | grep -E "^[A-Z]|peak" | head -40
cp "$W/summary.txt" "$OUT/"
tar czf "$OUT/all.tgz" -C "$W" .
cat "$W"/attention*.md "$W"/products/attention*.md 2>/dev/null | grep -E "^\|" | cut -c1-460
