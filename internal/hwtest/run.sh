#!/usr/bin/env bash
# Runs gpuiso's hardware suite from its bundle (see `make hwtest`), as root on
# a node with NVIDIA GPUs. Needs no Go, Docker or registry; it never changes a
# GPU's settings (MIG mode included). Arguments are passed to every test
# binary (e.g. -test.run=CUDA). Exit status 0 means every suite passed.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)

gpu=1
[ -e /proc/driver/nvidia/version ] || gpu=0
# On a GPU node a skip of the hardware suites is a failure; elsewhere they
# skip and say why.
if [ -z "${GPUISO_REQUIRE+x}" ]; then
  if [ "$gpu" -eq 1 ]; then export GPUISO_REQUIRE=gpu,root,nvidia-libs; else export GPUISO_REQUIRE=; fi
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "hwtest: run as root: the suites create cgroups, device nodes and containers" >&2
  exit 1
fi
# Native containers see neither the host's /tmp nor its /var/tmp (each gets
# a private one), where a bundle is often unpacked: the binaries the
# containers run are copied to a directory of root's own first.
mkdir -p /var/lib/gpuiso-test
bin=$(mktemp -d /var/lib/gpuiso-test/hwbundle-XXXXXX)
cp -a "$here/bin/." "$bin/"
export GPUISO_PROBE=$bin/probe GPUISO_CUDACHECK=$bin/cudacheck

echo "hwtest: revision $(cat "$here/REVISION" 2>/dev/null || echo unknown), GPUISO_REQUIRE=$GPUISO_REQUIRE"
if [ "$gpu" -eq 1 ]; then
  echo "hwtest: driver $(head -n1 /proc/driver/nvidia/version)"
  command -v nvidia-smi >/dev/null && nvidia-smi -L
fi

work=$(mktemp -d)
trap 'rm -rf "$work" "$bin"' EXIT
failed=()
suite() { # suite NAME [ARGS...]: one test binary, run from an empty directory
  local name=$1
  shift
  echo "== $name"
  if ! (cd "$work" && "$bin/$name.test" -test.v -test.count=1 "$@"); then
    failed+=("$name")
  fi
}
suite hwtest "$@"
suite nvmlnode -test.run='^TestDiscover(RealGPU|DriverNotLoaded)$' "$@"
suite native "$@"
suite cgroups -test.skip='^TestProgram$' "$@" # its golden listings stay in the source tree

if [ ${#failed[@]} -gt 0 ]; then
  echo "hwtest: FAIL: ${failed[*]}"
  exit 1
fi
if [ "$gpu" -eq 0 ]; then
  echo "hwtest: PASS without a GPU: no NVIDIA kernel driver here, so the hardware tests skipped (see above)"
else
  echo "hwtest: PASS"
fi
