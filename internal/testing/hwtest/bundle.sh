#!/usr/bin/env bash
# Builds gpuiso's hardware suite bundle into DIR (default hwbundle): stripped
# test binaries, the static probe, cudacheck, runc, run.sh, and
# DIR/gpuiso-hwtest.tar.gz holding them all. The GPU node then needs neither
# Go nor Docker nor a registry:
#   tar xzf gpuiso-hwtest.tar.gz && sudo bash gpuiso-hwtest/run.sh
#
#   bundle.sh [--vm] [DIR]
#
# The bundle holds the hardware suites (internal/testing/hwtest, node/nvmlnode) and
# the cgroup2 suites: the isolation and runtime suites that the
# cgroup2-only VM of internal/testing/vmtest runs too (see run.sh). The example
# programs those suites run (gpurun, agent, gpuiso-runtime) are their test
# binaries run as the program (a two-line script each), which keeps the
# tarball under its limit. --vm builds the VM's bundle: the cgroup2 suites
# only, no tarball.
set -euo pipefail

vm=0
if [ "${1:-}" = --vm ]; then
  vm=1
  shift
fi
root=$(cd "$(dirname "$0")/../../.." && pwd)
out=${1:-$root/hwbundle}
case $out in /*) ;; *) out=$PWD/$out ;; esac
GO=${GO:-go}
CC=${CC:-gcc}
# go-nvml's cgo prolog names every deprecated NVML call; keep the log readable.
export CGO_CFLAGS=${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}
max=$((64 << 20)) # the tarball's limit in bytes

# The suites worth running on real hardware (this package, real discovery),
# then the cgroup2 suites: isolation on the real kernel, the runtimes, the
# agent, the recovery conformance suite.
hw_pkgs=(internal/testing/hwtest node/nvmlnode)
v2_pkgs=(isolator/cgroups containerizer/native containerizer/chain examples/agent examples/gpurun internal/testing/conformance cmd/gpuiso-runtime)
pkgs=("${v2_pkgs[@]}")
[ "$vm" -eq 1 ] || pkgs=("${hw_pkgs[@]}" "${pkgs[@]}")

stage=$out/gpuiso-hwtest
rm -rf "$stage" "$out/bin" "$out/run.sh" "$out/REVISION" "$out/gpuiso-hwtest.tar.gz"
mkdir -p "$stage/bin"
cd "$root"
# One go command for every package: it compiles and links them in parallel.
"$GO" test -c -buildvcs=false -ldflags='-s -w' -o "$stage/bin/" "${pkgs[@]/#/./}"
CGO_ENABLED=0 "$GO" build -buildvcs=false -trimpath -ldflags='-s -w' -o "$stage/bin/probe" ./testdata/probe
[ "$vm" -eq 1 ] || "$CC" -O2 -s -Wall -Wextra -Werror -o "$stage/bin/cudacheck" testdata/cudacheck/cudacheck.c -ldl

# The programs, as their test binaries run them.
program() { # program NAME TEST_BINARY ENV_VAR
  printf '#!/bin/sh\n# %s: the test binary %s run as the program.\n%s=1 exec "$(dirname "$0")/%s" "$@"\n' "$1" "$2" "$3" "$2" >"$stage/bin/$1"
  chmod 0755 "$stage/bin/$1"
}
program gpurun gpurun.test GPUISO_TEST_AS_GPURUN
program agent agent.test GPUISO_TEST_AS_AGENT
program gpuiso-runtime gpuiso-runtime.test GPUISO_RUNTIME_AS_MAIN
# runc for gpuiso-runtime's suite (GPU nodes without Docker have none): the
# one .ci/current-docker.sh builds, when this host has it.
runc=${GPUISO_DOCKERD_BIN_DIR:-/var/cache/gpuiso/bin}/runc
if [ -x "$runc" ]; then
  cp "$runc" "$stage/bin/runc"
else
  echo "bundle: no $runc (bash .ci/current-docker.sh builds it): run.sh will use the node's runc, if any" >&2
fi
install -m 0755 internal/testing/hwtest/run.sh "$stage/run.sh"
git rev-parse --short HEAD >"$stage/REVISION" 2>/dev/null || echo unknown >"$stage/REVISION"

if [ "$vm" -eq 0 ]; then
  tar -C "$out" -czf "$out/gpuiso-hwtest.tar.gz" gpuiso-hwtest
fi
# The unpacked layout at the top too, so that `bash DIR/run.sh` works in place.
mv "$stage/bin" "$stage/run.sh" "$stage/REVISION" "$out/"
rmdir "$stage"
if [ "$vm" -eq 1 ]; then
  echo "bundle: $out (cgroup2-only VM): ${pkgs[*]}, probe"
  exit 0
fi

size=$(stat -c %s "$out/gpuiso-hwtest.tar.gz")
if [ "$size" -ge "$max" ]; then
  echo "bundle: $out/gpuiso-hwtest.tar.gz is $size bytes, over the 64 MiB limit" >&2
  exit 1
fi
echo "bundle: $out/gpuiso-hwtest.tar.gz ($((size >> 20)) MiB): ${pkgs[*]}, probe, cudacheck, runc"
echo "bundle: on the GPU node, as root: bash $out/run.sh (or unpack the tarball and run gpuiso-hwtest/run.sh)"
