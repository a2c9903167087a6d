#!/usr/bin/env bash
# Builds gpuiso's hardware suite bundle into DIR (default hwbundle): stripped
# test binaries, the static probe, cudacheck, run.sh, and DIR/gpuiso-hwtest.tar.gz
# holding them all. The GPU node then needs neither Go nor Docker nor a registry:
#   tar xzf gpuiso-hwtest.tar.gz && sudo bash gpuiso-hwtest/run.sh
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/hwbundle}
case $out in /*) ;; *) out=$PWD/$out ;; esac
GO=${GO:-go}
CC=${CC:-gcc}
# go-nvml's cgo prolog names every deprecated NVML call; keep the log readable.
export CGO_CFLAGS=${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}
max=$((64 << 20)) # the tarball's limit in bytes

# The suites worth running on real hardware: this package, real discovery,
# and the isolation suites on the real kernel and driver.
pkgs=(internal/hwtest node/nvmlnode containerizer/native isolator/cgroups)

stage=$out/gpuiso-hwtest
rm -rf "$stage" "$out/bin" "$out/run.sh" "$out/gpuiso-hwtest.tar.gz"
mkdir -p "$stage/bin"
cd "$root"
for p in "${pkgs[@]}"; do
  "$GO" test -c -buildvcs=false -ldflags='-s -w' -o "$stage/bin/$(basename "$p").test" "./$p"
done
CGO_ENABLED=0 "$GO" build -buildvcs=false -trimpath -ldflags='-s -w' -o "$stage/bin/probe" ./testdata/probe
"$CC" -O2 -s -Wall -Wextra -Werror -o "$stage/bin/cudacheck" testdata/cudacheck/cudacheck.c -ldl
install -m 0755 internal/hwtest/run.sh "$stage/run.sh"
git rev-parse --short HEAD >"$stage/REVISION" 2>/dev/null || echo unknown >"$stage/REVISION"

tar -C "$out" -czf "$out/gpuiso-hwtest.tar.gz" gpuiso-hwtest
# The unpacked layout at the top too, so that `bash DIR/run.sh` works in place.
mv "$stage/bin" "$stage/run.sh" "$stage/REVISION" "$out/"
rmdir "$stage"

size=$(stat -c %s "$out/gpuiso-hwtest.tar.gz")
if [ "$size" -ge "$max" ]; then
  echo "bundle: $out/gpuiso-hwtest.tar.gz is $size bytes, over the 64 MiB limit" >&2
  exit 1
fi
echo "bundle: $out/gpuiso-hwtest.tar.gz ($((size >> 20)) MiB): ${pkgs[*]}, probe, cudacheck"
echo "bundle: on the GPU node, as root: bash $out/run.sh (or unpack the tarball and run gpuiso-hwtest/run.sh)"
