#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py), on a machine with an NVIDIA GPU, from any folder:
#   bash bench/gpu_check.sh
# It uses the machine's python3 as it is (torch, numpy, msgpack, nvidia-ml-py, pytest) and
# installs nothing. Exit status: 0 all checks passed on CUDA, 1 a check failed, 2 no CUDA here.
set -uo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
PYTHONPATH=. exec "${PYTHON:-python3}" bench/gpu_check.py "$@"
