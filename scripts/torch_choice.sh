#!/usr/bin/env bash
# Which torch build this machine wants, printed as one word (scripts/setup.sh reads it):
#   cpu      Linux x86-64 without a working NVIDIA GPU: PyTorch's CPU wheel index. The public index
#            would resolve the pinned torch to the CUDA build and several GB of nvidia-* packages.
#   default  an NVIDIA GPU answers `nvidia-smi -L` (the CUDA build from the public index), or macOS /
#            Linux on ARM / Windows, where the public index's torch is already the CPU build.
# A GPU counts only if `nvidia-smi -L` lists one: a driver tool without a GPU behind it is CPU-only.
set -euo pipefail
if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
  echo cpu
else
  echo default
fi
