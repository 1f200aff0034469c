#!/usr/bin/env bash
# Every GPU check of meshprof in one run, for a lent GPU machine with no network (its image has
# torch, CUDA's toolkit and ninja; meshprof installs from this checkout without dependencies).
#
#   bash benchmarks/gpu_session.sh OUT_DIR [SECONDS] [STAGES]
#
# STAGES: a comma-separated subset of step,native,overhead,cost,probe,gpu-tests,demo,bench,suite
# (default: all); "suite" may be "suite=TEST_PATHS" (space-separated paths, the failing subset).
#
# Writes OUT_DIR/session.log (everything) and the checks' JSON and trace files; prints one line
# per stage and the checks' tables. SECONDS (default 540) bounds the whole run: the test suite,
# last and in the background of the untimed checks, gets what is left.
set -u
OUT=${1:?usage: gpu_session.sh OUT_DIR [SECONDS]}
BUDGET=${2:-540}
STAGES=",${3:-step,native,overhead,cost,probe,gpu-tests,demo,bench,suite},"
want() { [[ $STAGES == *",$1"[,=]* ]]; }
mkdir -p "$OUT"
LOG=$OUT/session.log
START=$(date +%s)
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/meshprof-ext PIP_NO_INDEX=1
PY=python3
left() { echo $((BUDGET - ($(date +%s) - START))); }
stage() {  # stage NAME SECONDS CMD...: run with a limit; everything to the log, the tail shown
  local name=$1 t=$2
  shift 2
  echo "=== $name (limit ${t}s, $(left)s left)" >>"$LOG"
  timeout -k 5 "$t" "$@" >"$OUT/.stage" 2>&1
  local rc=$?
  cat "$OUT/.stage" >>"$LOG"
  echo "=== $name rc=$rc" >>"$LOG"
  echo "--- $name: rc=$rc ($(($(date +%s) - START))s)"
  grep -E "^(ok|FAILED|#|\||[a-z -]+ +[0-9]+ MiB|model=|variant|plain|meshprof|torch.profiler|idle|probe|recorder|step monitor)" \
    "$OUT/.stage" | tail -n 40
  echo "    (last lines)" && tail -n 4 "$OUT/.stage" | cut -c1-300
  rm -f "$OUT/.stage"
  return $rc
}

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  $PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
  $PY -c "import torch.utils.cpp_extension as c; print('CUDA_HOME', c.CUDA_HOME)"
  nproc
} >>"$LOG" 2>&1
head -n 8 "$LOG"

if ! $PY -m pip install -q --no-deps --no-build-isolation -e . >>"$LOG" 2>&1; then
  echo "pip install -e . failed: PYTHONPATH=src and a meshprof shim instead"
  export PYTHONPATH=$PWD/src
  mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m meshprof.cli "$@"\n' >/tmp/bin/meshprof
  chmod +x /tmp/bin/meshprof && export PATH=/tmp/bin:$PATH
fi

stage build-native 240 $PY -c "
from meshprof.comm import native, native_ext
native.load()
print('native recorder built; CUDA device timing in:', native_ext.build_with_cuda())"

# timed checks first, on an idle machine
want step && stage step-check 150 $PY benchmarks/gpu_step_check.py --out /tmp/step
want step && cp /tmp/step/step_check.json /tmp/step/kineto.json "$OUT"/ 2>/dev/null
want step && cp /tmp/step/trace.json.gz "$OUT"/ 2>/dev/null
want native && stage native-check 150 $PY benchmarks/gpu_native_check.py --ranks 1 --iters 20 --out "$OUT/native_check.json"
want overhead && stage overhead 150 $PY benchmarks/training_overhead.py --nproc 1 --device cuda --model gpt --rounds 6 --steps 20
want cost && stage cost-per-collective 90 $PY benchmarks/default_cost.py --workload nccl1 --batch 200 --rounds 20
want probe && stage probe 90 $PY benchmarks/gpu_kernel_probe.py

# the suite in the background, the untimed checks beside it
SUITE_T=$(($(left) - 20))
SUITE_PATHS=tests
[[ $STAGES =~ ,suite=([^,]*), ]] && SUITE_PATHS=${BASH_REMATCH[1]}
SUITE=""
if want suite; then
  echo "=== suite $SUITE_PATHS (limit ${SUITE_T}s)" >>"$LOG"
  timeout -k 5 "$SUITE_T" $PY -m pytest -q -p no:cacheprovider -n 10 --timeout 240 -rfE \
    $SUITE_PATHS >"$OUT/suite.log" 2>&1 &
  SUITE=$!
fi
want gpu-tests && stage pytest-gpu 120 $PY -m pytest -q -p no:cacheprovider -m gpu -rsfE tests/test_native_device_timing.py tests/test_recorder.py
want demo && stage demo-cuda 150 meshprof demo --device cuda --dp 1 --tp 1 --pp 1 --steps 6 -o /tmp/demo
want bench && stage bench 60 meshprof bench --nproc 1 -e 64M -n 10
if [[ -n $SUITE ]]; then
  wait $SUITE
  echo "--- suite: rc=$? ($(($(date +%s) - START))s)"
  grep -E "^(FAILED|ERROR)" "$OUT/suite.log" | cut -c1-200 | head -n 40
  tail -n 2 "$OUT/suite.log"
fi
