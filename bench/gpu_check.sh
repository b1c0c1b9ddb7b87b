#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the GPU-marked tests, then the benchmark on CUDA.
# Meant to finish in under 5 minutes; prints everything it measured.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/dev.sh test -q -m gpu tests/test_gpu.py
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
.venv/bin/python bench/run.py --device cuda --rounds 2 --models default,cnn,transformer --output bench/results-gpu
