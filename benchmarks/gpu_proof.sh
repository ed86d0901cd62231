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
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "gpu_proof: installing the wheels in .whl/ failed; run benchmarks/gpu_proof_wheels.sh first"; exit 2; }
{ nvidia-smi; nvidia-smi -q -d CLOCK,POWER; python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } \
  > "$OUT/machine.txt" 2>&1
roofline() { python3 -m estimator.cli "$@"; }

timeout 150 roofline calibrate --device cuda --quick --out "$OUT/profile.yaml" --force 2>&1 | tee "$OUT/calibrate.log"
[ -s "$OUT/profile.yaml" ] || { echo "gpu_proof: calibration wrote no profile"; exit 1; }

for model in meta-llama/Llama-3.1-8B Qwen/Qwen3-30B-A3B; do
  name=$(basename "$model")
  timeout 120 roofline validate --local --device cuda --model "$model" --batch 1 --batch 8 --batch 64 \
    --prompt 512 --output 32 --calibration "$OUT/profile.yaml" --json > "$OUT/validate-$name.json" \
    2> "$OUT/validate-$name.log"
  echo "validate $name: exit $?"
done
ls -l "$OUT"
