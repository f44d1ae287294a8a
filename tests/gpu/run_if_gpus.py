#!/usr/bin/env python3
"""run_if_gpus.py N COMMAND...: runs COMMAND when at least N NVIDIA GPUs are visible, else exits
77 (ctest's skip). Every process gets NCCL_NVLS_ENABLE=0."""
import os
import subprocess
import sys

need = int(sys.argv[1])
try:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    gpus = sum(1 for line in out.splitlines() if line.startswith("GPU "))
except (OSError, subprocess.SubprocessError):
    gpus = 0
if gpus < need:
    print(f"skipped: {gpus} GPUs visible, {need} needed")
    sys.exit(77)
env = dict(os.environ, NCCL_NVLS_ENABLE="0")
sys.exit(subprocess.run(sys.argv[2:], env=env).returncode)
