#!/usr/bin/env bash
# Mini-batch GPU session in one call: the loader's CUDA tests, the single-GPU mini-batch benchmark
# (with torch.profiler tables), then the DDP example (NCCL) for each "GPUS:GLOBAL_BATCH" of DDP_RUNS.
#   PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/minibatch.sh
# BENCH_ARGS goes to benchmarks.bench_minibatch (BENCH=0 skips it), DDP_ARGS to examples/train_ddp.py,
# TESTS=0 skips the tests. DDP_RUNS: "GPUS:GLOBAL_BATCH[:MODE]" runs one after the other (MODE: prefetch,
# graph = --cuda-graph, graph+prefetch); DDP_PAIRS: "A/B" specs of two 1-GPU runs run at once on GPUs 0 and 1;
# DDP_BESIDE_TESTS: 1-GPU specs run one after the other on GPU 0 while the tests run on the last GPU
# (saves device time on a machine of several GPUs). Nothing here needs the C++ extensions (the GPU path is Triton and torch
# ops), so nothing is built. TEST_FILES: the test files (default tests/test_loader.py). Everything is packed into $OUT/results.tgz (the device tool brings back
# only a few files) next to $OUT/summary.txt; the Triton kernel cache goes to $OUT/triton_cache.tgz,
# which a later call can unpack into TRITON_CACHE_DIR (TRITON_CACHE_TGZ) to skip the compiles.
set -uo pipefail
source "${BASH_SOURCE%/*}/lib.sh"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/triton_cache}"
NGPU=$(nvidia-smi -L | wc -l)
mkdir -p "$TRITON_CACHE_DIR"
[ -n "${TRITON_CACHE_TGZ:-}" ] && [ -f "$TRITON_CACHE_TGZ" ] && tar xzf "$TRITON_CACHE_TGZ" -C "$TRITON_CACHE_DIR"
gpu_header
tests() {
  step tests "${TESTS_TIMEOUT_S:-120}" "$PY" -m pytest ${TEST_FILES:-tests/test_loader.py} ${PYTEST_FLAGS:--q} -p no:cacheprovider -rs \
    -k "${TESTS_K:-cuda or fresh}"
}
if [ "${TESTS:-1}" != 0 ] && [ -z "${DDP_BESIDE_TESTS:-}" ]; then tests; fi
[ "${BENCH:-1}" != 0 ] && step bench "${BENCH_TIMEOUT_S:-240}" "$PY" -m benchmarks.bench_minibatch --device cuda \
  --out "$W/bench" --profile "$W/profile" ${BENCH_ARGS:-}
ddp() {  # ddp GPUS:GLOBAL_BATCH[:MODE] [CUDA_VISIBLE_DEVICES]; MODE: prefetch, graph (--cuda-graph) or graph+prefetch
  local n batch mode name flags=""
  IFS=: read -r n batch mode <<< "$1"
  [ "$n" -gt "$NGPU" ] && return
  name="ddp_${n}gpu_b${batch}${mode:+_${mode/+/_}}"
  [[ "$mode" == *prefetch* ]] && flags="$flags --prefetch"
  [[ "$mode" == *graph* ]] && flags="$flags --cuda-graph"
  CUDA_VISIBLE_DEVICES="${2:-$CUDA_VISIBLE_DEVICES_ALL}" step "$name" "${DDP_TIMEOUT_S:-120}" "$PY" -m torch.distributed.run \
    --standalone --nproc-per-node "$n" \
    examples/train_ddp.py --batch-size "$batch" --out "$W/$name" $flags ${DDP_ARGS:-}
}
CUDA_VISIBLE_DEVICES_ALL="$(seq -s, 0 $((NGPU - 1)))"
if [ -n "${DDP_BESIDE_TESTS:-}" ]; then  # 1-GPU runs on GPU 0, the tests on the last GPU, at once
  ( for spec in $DDP_BESIDE_TESTS; do ddp "$spec" 0; done ) &
  if [ "${TESTS:-1}" != 0 ]; then CUDA_VISIBLE_DEVICES=$((NGPU - 1)) tests; fi
  wait
fi
for spec in ${DDP_PAIRS:-}; do  # A/B: two 1-GPU runs at once, A on GPU 0 and B on GPU 1 (saves device time)
  ddp "${spec%%/*}" 0 & ddp "${spec##*/}" 1 & wait
done
for spec in ${DDP_RUNS:-1:1024 $NGPU:1024}; do  # GPUS:GLOBAL_BATCH[:MODE], one after the other
  ddp "$spec"
done
grep -hE "^\| (train step|graph prep|fused step split|sampling)" "$W"/bench/*.md 2>/dev/null
for f in "$W"/ddp_*/*.md; do [ -f "$f" ] && { echo "== $f"; tail -n "${DDP_TAIL:-8}" "$f"; }; done
tail -n 3 "$W/tests.log" 2>/dev/null
pack results "$W"/bench/*.md
[ "${SAVE_TRITON_CACHE:-1}" != 0 ] && tar czf "$OUT/triton_cache.tgz" -C "$TRITON_CACHE_DIR" .
exit 0
