#!/usr/bin/env bash
# The attention work's GPU session in one call: the CUDA tests of the attention ops (Triton
# backends: multi-head edge weights, GATv2/Transformer with edge features, hub splitting), the
# edge-block sweep, then the training-step benchmark vs PyG (with and without edge features).
# From the repo root on a CUDA machine:  PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/attention.sh
# Logs and results land in $OUT (the device tool brings back at most 8 files: results are packed).
set -uo pipefail
: "${OUT:?set OUT to the output directory}"
export PYTHONPATH="${PYTHONPATH:-.}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python}"
W="$(mktemp -d)"
GRAPHS="${ATT_GRAPHS:-arxiv-like,community-arxiv}"   # the training-step benchmark's suite graphs
EDGE_GRAPHS="${ATT_EDGE_GRAPHS-arxiv-like}"           # with edge features (empty: skipped)
SWEEP_LAYERS="${ATT_SWEEP_LAYERS:-GATv2Conv}" SWEEP="${ATT_SWEEP:-8,16,32}"  # edge block / warps sweep
# the C++ graph extension (CPU-side CSR builds in the tests), built while the first tests run
MAX_JOBS=16 "$PY" -c "from gnnfuse._build import load_extension; load_extension('graph')" > "$W/build.log" 2>&1 &
step() {  # step NAME TIMEOUT_S CMD...
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" > "$W/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - start))s" | tee -a "$W/summary.txt"
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$W/summary.txt"
step tests "${ATT_TESTS_S:-120}" "$PY" -m pytest -q -p no:cacheprovider --durations=8 \
  tests/test_attention_head_weights.py tests/test_pair_attention.py tests/test_pair_attention_layers.py \
  -k "${ATT_TEST_K:-triton or hub or edge_features}"
step sweep "${ATT_SWEEP_S:-70}" "$PY" -m benchmarks.bench_attention --device cuda --layers "$SWEEP_LAYERS" \
  --graphs arxiv-like --edge-blocks "$SWEEP" --rounds 5 --out "$W"
step bench "${ATT_BENCH_S:-150}" "$PY" -m benchmarks.bench_attention --device cuda --layers GATConv,GATv2Conv,TransformerConv \
  --graphs "$GRAPHS" --rounds 5 --out "$W"
[ -n "$EDGE_GRAPHS" ] && step bench_edge 60 "$PY" -m benchmarks.bench_attention --device cuda \
  --layers GATv2Conv,TransformerConv --graphs "$EDGE_GRAPHS" --edge-dim 8 --rounds 5 --out "$W"
tail -n 3 "$W/tests.log"
cp "$W/summary.txt" "$OUT/"
cp "$W"/*.md "$OUT/" 2>/dev/null
tar czf "$OUT/all.tgz" -C "$W" .
cat "$W"/attention*.md | grep -E "^\|" | cut -c1-400
