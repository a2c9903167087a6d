#!/usr/bin/env bash
# The README's first command: runs a command as a GPU container on a simulated
# DGX-1 (SIM=NAME for another shipped topology). As root, on Debian 12 with Go
# installed and nothing else: it checks Go, provisions only what it needs (the
# NVIDIA user-space driver, a C compiler for cgo) idempotently, builds the
# example programs into bin/ and runs bin/gpurun.
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/env.sh
bash .ci/provision.sh --driver-only
go build -o bin/ $(go list ./examples/... | grep -v /examples/gpuiso-runtime$) ./cmd/...
exec bin/gpurun --simulate "${SIM:-dgx1-volta}" --gpus 2 -- \
  sh -c 'ls -l /dev; echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES'
