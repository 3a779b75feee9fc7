#!/usr/bin/env bash
# Mini-batch GPU session in one call: the sampler extension, the loader's CUDA test, the single-GPU
# mini-batch benchmark (GPU 0) and the DDP example on 1 GPU and on every GPU of the host (NCCL).
#   PYTHONPATH=. OUT=/some/dir bash benchmarks/gpu/minibatch.sh
# BENCH_ARGS goes to benchmarks.bench_minibatch, DDP_ARGS to examples/train_ddp.py.
set -uo pipefail
: "${OUT:?set OUT to the output directory}"
export PYTHONPATH="${PYTHONPATH:-.}" MAX_JOBS="${MAX_JOBS:-16}"
PY="${PYTHON:-python}"
NGPU=$(nvidia-smi -L | wc -l)
run() {  # run STEP TIMEOUT_S CMD...: log to $OUT/STEP.log, rc and seconds to $OUT/summary.txt
  local step=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$step.log" 2>&1
  echo "$step rc=$? $((SECONDS - start))s" | tee -a "$OUT/summary.txt"
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
run build 120 "$PY" -c "from gnnfuse._build import load_extension; load_extension('sampler')"
run tests 60 "$PY" -m pytest tests/test_loader.py -q -p no:cacheprovider -k cuda
run bench "${BENCH_TIMEOUT_S:-120}" "$PY" -m benchmarks.bench_minibatch --device cuda --out "$OUT" ${BENCH_ARGS:-}
for n in 1 "$NGPU"; do
  run "ddp_${n}gpu" "${DDP_TIMEOUT_S:-120}" "$PY" -m torch.distributed.run --standalone --nproc-per-node "$n" \
    examples/train_ddp.py --out "$OUT" ${DDP_ARGS:-}
  [ "$NGPU" -eq 1 ] && break
done
tail -n 2 "$OUT"/tests.log
for f in "$OUT"/ddp_*gpu.log; do tail -n 8 "$f"; done
