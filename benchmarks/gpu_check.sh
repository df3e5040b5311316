#!/usr/bin/env bash
# GPU check (issues #13, #21): quickstart on CUDA vs CPU (fp32 with TF32 off must agree to 1e-4
# relative; bf16 differences reported) and P2 at the Pythia-410m shape in bf16 and fp32 against
# the naive loop and the floor, and the paper-scale analysis (12 units, d = 768, ranks 8/32/128)
# on CPU vs CUDA. One command, <= 8 minutes on one GPU; prints a markdown table
# for benchmarks/README.md. `--dry-run` runs the same steps on the CPU at a tiny shape.
#
#   bash benchmarks/gpu_check.sh            # on a machine with a GPU
#   bash benchmarks/gpu_check.sh --dry-run  # anywhere (tests the script)
#
# PYTHON selects the interpreter (default: python3). Exit status: 0 when the fp32 agreement
# holds, 1 when it does not, 2 on a setup error.
set -euo pipefail
cd "$(dirname "$0")/.."
export NVIDIA_TF32_OVERRIDE=0  # no TF32 anywhere: the fp32 comparison is meant at fp32 precision
# the 8-minute budget is the GPU run's; a dry run on a shared CPU may take longer
limit=480
for argument in "$@"; do [ "$argument" = "--dry-run" ] && limit=1800; done
exec timeout "$limit" "${PYTHON:-python3}" benchmarks/gpu_check.py "$@"
