#!/usr/bin/env bash
# Prove the CUDA path on one NVIDIA GPU in a single run of about five minutes: calibrate the device,
# then time a random-weight Llama-3.1-8B and Qwen3-30B-A3B (MoE) at batch 1, 8 and 64 against the
# estimate for that calibrated device. Everything it measures lands in $OUT (default ./gpu-proof):
# the profile, the validation JSON, the logs and nvidia-smi's view of the machine.
#
# The machine's Python has torch with CUDA, numpy, pyyaml, matplotlib and jinja2, but no pydantic and
# no package registry: benchmarks/gpu_proof_wheels.sh fetches the missing wheels into .whl/ beforehand;
# the project installs with --no-deps and torch is never reinstalled.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu-proof}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD"
PYTHON=${PYTHON:-python3}   # INSTALL=0 PYTHON=... : an environment that already has the project's needs (the test)
if [ "${INSTALL:-1}" = 1 ]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_proof: installing the wheels in .whl/ failed; run benchmarks/gpu_proof_wheels.sh first"; exit 2; }
fi
{ nvidia-smi; nvidia-smi -q -d CLOCK,POWER; "$PYTHON" -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } \
  > "$OUT/machine.txt" 2>&1
roofline=("$PYTHON" -m estimator.cli)   # an array, not a function: timeout runs programs, not shell functions

# DEVICE, MODELS, BATCHES and PROMPT may be overridden for a dry run of the script itself
# (DEVICE=cpu MODELS=Qwen/Qwen2.5-0.5B BATCHES=1 PROMPT=16);
# MODE=full takes the full calibration plan (21 s on an H200 on 2026-11-30) instead of the quick one.
DEVICE=${DEVICE:-cuda}
MODELS=${MODELS:-meta-llama/Llama-3.1-8B Qwen/Qwen3-30B-A3B}
MODE=${MODE:-quick}
BATCHES=${BATCHES:-1 8 64}
PROMPT=${PROMPT:-512}
OUTPUT=${OUTPUT:-32}
PROFILE=${PROFILE:-}   # a profile to validate with instead of calibrating again
SECONDS=0
if [ "$DEVICE" = cuda ]; then   # clocks and power once a second while everything runs
  nvidia-smi dmon -s pc -d 1 > "$OUT/dmon.txt" 2>&1 &
  trap 'kill %1 2>/dev/null' EXIT
fi
if [ -z "$PROFILE" ]; then
  PROFILE="$OUT/profile.yaml"
  timeout 150 "${roofline[@]}" calibrate --device "$DEVICE" --"$MODE" --out "$PROFILE" --force 2>&1 \
    | tee "$OUT/calibrate.log"
  [ -s "$PROFILE" ] || { echo "gpu_proof: calibration wrote no profile"; exit 1; }
  echo "calibrated in ${SECONDS} s"
fi

for model in $MODELS; do
  name=$(basename "$model")
  timeout 120 "${roofline[@]}" validate --local --device "$DEVICE" --model "$model" $(printf -- '--batch %s ' $BATCHES) \
    --prompt "$PROMPT" --output "$OUTPUT" --calibration "$PROFILE" --json > "$OUT/validate-$name.json" \
    2> "$OUT/validate-$name.log"
  echo "validate $name: exit $? after ${SECONDS} s"; tail -3 "$OUT/validate-$name.log"
done
ls -l "$OUT"
