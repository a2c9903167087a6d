#!/usr/bin/env bash
# Builds a current Docker daemon and what it runs from the Go module proxy,
# for the suites that need a daemon newer than Debian's (Docker's CDI path):
# dockerd (moby v2, API 1.44+), containerd 2 with its runc shim and ctr, and
# runc 1.3 (Debian's runc 1.1 cannot run that daemon's containers). Each
# binary is built once into the directory given (default
# /var/cache/gpuiso/bin) and kept: a second run is a no-op. Needs Go, a C
# compiler and libseccomp-dev (for runc). Takes minutes on a quiet 2-core host.
#
#   current-docker.sh [DIR]
set -euo pipefail

bin=${1:-/var/cache/gpuiso/bin}
src=$(dirname "$bin")/src
export PATH=$PATH:/usr/local/go/bin
mkdir -p "$bin" "$src"/{dockerd,containerd,runc}

# build MODULE_DIR VERSION OUT PACKAGE [go build flags...]
build() {
  local dir=$1 ver=$2 out=$3 pkg=$4
  shift 4
  [ -x "$bin/$out" ] && return 0
  (
    cd "$dir"
    [ -f go.mod ] || go mod init "gpuiso.local/$(basename "$dir")"
    go get -tool "$pkg@$ver"
    go build "$@" -o "$bin/$out" "$pkg"
  )
}

CGO_ENABLED=0 build "$src/dockerd" v2.0.0-beta.24 dockerd github.com/moby/moby/v2/cmd/dockerd \
  -tags 'no_btrfs exclude_graphdriver_btrfs exclude_graphdriver_devicemapper'
for c in containerd containerd-shim-runc-v2 ctr; do
  CGO_ENABLED=0 build "$src/containerd" v2.1.4 "$c" "github.com/containerd/containerd/v2/cmd/$c" \
    -tags 'no_btrfs no_devmapper no_zfs'
done
CGO_ENABLED=1 build "$src/runc" v1.3.3 runc github.com/opencontainers/runc -tags seccomp
ls -l "$bin"
