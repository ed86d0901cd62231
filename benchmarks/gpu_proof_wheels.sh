#!/usr/bin/env bash
# Fetch the wheels benchmarks/gpu_proof.sh installs on a GPU machine whose Python (3.12) has torch with
# CUDA, numpy, pyyaml, matplotlib and jinja2 but no pydantic and no package registry. Run it here, where
# pip reaches the registry; the wheels land in .whl/ (ignored by git), which travels with the run.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
# pydantic and what it needs beyond the standard library; nvidia-ml-py for the device identity;
# gguf for reading GGUF files (pure Python). Versions pinned so the set installs as one.
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 \
  typing-extensions==4.15.0 nvidia-ml-py==13.580.82 gguf==0.19.0
ls -1 .whl
