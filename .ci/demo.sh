#!/usr/bin/env bash
# The README's first command: runs a command as a GPU container on a simulated
# DGX-1 (SIM=NAME for another shipped topology). As root, on Debian 12 with Go
# installed and nothing else: it provisions only what it needs (the NVIDIA
# user-space driver, a C compiler for cgo) idempotently, then runs gpurun.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v go >/dev/null 2>&1 || export PATH="$PATH:/usr/local/go/bin"
bash .ci/provision.sh --driver-only
# go-nvml's cgo prolog names every deprecated NVML call; keep the build quiet.
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
exec go run ./examples/gpurun --simulate "${SIM:-dgx1-volta}" --gpus 2 -- \
  sh -c 'ls -l /dev; echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES'
