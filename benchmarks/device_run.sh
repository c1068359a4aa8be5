#!/usr/bin/env bash
# The prepared GPU run (docs/benchmarks.md, "The prepared GPU run"): the rows of benchmarks/device_run.py
# within one call's time limit on a GPU machine without network, the results under $OUT.
#
#   benchmarks/device_run.sh 1 [LIMIT_S]   every row, most needed first (LIMIT_S: 530 by default)
#   benchmarks/device_run.sh 2 [LIMIT_S]   the rows part 1 left (.device_run/part1.json; LIMIT_S: 220)
#
# It installs the carried wheels of .whl/ (make device-wheels) into /tmp/site, records the GPU
# (nvidia-smi), gives the rows LIMIT_S less its start and a reserve of RESERVE_S, and sends Python
# SIGTERM 15 s before LIMIT_S (the row in progress is then recorded as interrupted). Part 1's JSON is
# also kept in $DEVICE_RUN_STATE (default .device_run) for part 2. Writes $OUT/partN.json, .md, .log, _training.png, _vggt.png and
# _profile_trace.json.gz. Environment: OUT (default device_out), PYTHON (default python3), SMOKE=1 (tiny
# models on the CPU, no wheels: the test suite's run), DEVICE_RUN_ARGS (more options of `run`).
set -uo pipefail
part=${1:?usage: benchmarks/device_run.sh 1|2 [LIMIT_S]}
case $part in
  1) limit=${2:-530} ;;
  2) limit=${2:-220} ;;
  *) echo "error: benchmarks/device_run.sh: the part is 1 or 2, got '$part'" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.." || exit 2
out=${OUT:-device_out}
python=${PYTHON:-python3}
reserve=${RESERVE_S:-40}
state=${DEVICE_RUN_STATE:-.device_run}
mkdir -p "$out" "$state"
start=$SECONDS
{
  echo "device_run.sh part $part: limit ${limit} s, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  if [ -z "${SMOKE:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || { echo "error: the carried wheels in .whl did not install"; exit 3; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
  fi
  export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True} PYTHONUNBUFFERED=1
  args=(run --part "$part" --out "$out")
  if [ -n "${SMOKE:-}" ]; then args+=(--smoke); fi
  if [ "$part" = 2 ]; then args+=(--with "$state/part1.json"); fi
  spent=$((SECONDS - start))
  # shellcheck disable=SC2086  # DEVICE_RUN_ARGS is a list of options
  timeout -s TERM -k 10 $((limit - spent - 15)) "$python" -m benchmarks.device_run "${args[@]}" \
    --budget-s $((limit - spent - reserve)) ${DEVICE_RUN_ARGS:-}
  status=$?
  if [ "$part" = 1 ] && [ -f "$out/part1.json" ]; then cp "$out/part1.json" "$state/part1.json"; fi
  echo "device_run.sh part $part: exit status $status after $((SECONDS - start)) s"
  exit "$status"
} 2>&1 | tee "$out/part$part.log"
