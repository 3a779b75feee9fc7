# Shared by the GPU session scripts in this folder (sourced, never run on its own): a work folder,
# a summary, timed steps, the C++ extension build, and the packing of what the device tool brings
# back (it returns only a few files, so everything travels as one tarball next to the summary).
# A script sets `set -uo pipefail`, has OUT set by its caller, sources this file and writes into $W.
: "${OUT:?set OUT to the output directory}"
export PYTHONPATH="${PYTHONPATH:-.}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python}"
W="$(mktemp -d)"

gpu_header() {  # the GPU, the versions and the date at the top of the summary
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a "$W/summary.txt"
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1 \
    | tee -a "$W/summary.txt"
  date -u | tee -a "$W/summary.txt"
}

step() {  # step NAME LIMIT_S CMD...: output to $W/NAME.log, rc and seconds to the summary; LIMIT_S 0 skips it
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  [ "$limit" -gt 0 ] || return 0
  timeout "$limit" "$@" > "$W/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - start))s (limit ${limit}s)" | tee -a "$W/summary.txt"
}

build_extensions() {  # build_extensions LIMIT_S [EXT ...]: the C++ extensions (default: all) in parallel
  local limit=$1 ext pids=()
  shift
  local exts=("$@")
  [ ${#exts[@]} -gt 0 ] || read -ra exts <<< "$("$PY" -c "from gnnfuse._build_cache import EXTENSIONS; print(*EXTENSIONS)")"
  for ext in "${exts[@]}"; do  # each extension has its own build lock, so they build side by side
    MAX_JOBS="${MAX_JOBS:-16}" timeout "$limit" "$PY" -c "from gnnfuse._build import load_extension; load_extension('$ext')" \
      > "$W/build_$ext.log" 2>&1 &
    pids+=($!)
  done
  [ ${#pids[@]} -eq 0 ] || wait "${pids[@]}"
  echo "build ${exts[*]} done at ${SECONDS}s" | tee -a "$W/summary.txt"
}

pack() {  # pack NAME [FILE ...]: $W into $OUT/NAME.tgz, with the summary (and any FILEs) beside it
  local name=$1
  shift
  mkdir -p "$OUT"
  cp "$W/summary.txt" "$@" "$OUT"/ 2>/dev/null
  tar czf "$OUT/$name.tgz" -C "$W" .
}
