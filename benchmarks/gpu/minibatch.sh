#!/usr/bin/env bash
# Mini-batch GPU session in one call: the DDP example (NCCL) for each "GPUS:GLOBAL_BATCH" of DDP_RUNS,
# the loader's CUDA test, and the single-GPU mini-batch benchmark once per Triton kernel choice
# of KERNELS ("default" = gnnfuse's own choice; else GNNFUSE_TRITON_KERNEL).
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
# the host sampler's C++ kernel builds meanwhile (the GPU runs do not need it)
timeout 120 "$PY" -c "from gnnfuse._build import load_extension; load_extension('sampler')" > "$OUT/build.log" 2>&1 &
for spec in ${DDP_RUNS:-1:1024 $NGPU:1024}; do
  n=${spec%%:*} batch=${spec##*:}
  [ "$n" -gt "$NGPU" ] && continue
  run "ddp_${n}gpu_b${batch}" "${DDP_TIMEOUT_S:-120}" "$PY" -m torch.distributed.run --standalone --nproc-per-node "$n" \
    examples/train_ddp.py --batch-size "$batch" --out "$OUT/ddp_${n}gpu_b${batch}" ${DDP_ARGS:-}
done
wait
[ -n "${TESTS:-1}" ] && run tests 60 "$PY" -m pytest tests/test_loader.py -q -p no:cacheprovider -k cuda
for k in ${KERNELS:-default}; do
  env $([ "$k" != default ] && echo GNNFUSE_TRITON_KERNEL=$k) timeout "${BENCH_TIMEOUT_S:-120}" \
    "$PY" -m benchmarks.bench_minibatch --device cuda --out "$OUT/bench_$k" ${BENCH_ARGS:-} > "$OUT/bench_$k.log" 2>&1
  echo "bench_$k rc=$?" | tee -a "$OUT/summary.txt"
  grep -E "^\| (train step|graph prep|fused step split|sampling)" "$OUT/bench_$k/"*.md
done
for f in "$OUT"/ddp_*/*.md; do echo "== $f"; tail -n 6 "$f"; done
