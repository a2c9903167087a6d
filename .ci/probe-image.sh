#!/usr/bin/env bash
# Builds the examples' image without a registry: gpuiso-probe, FROM scratch
# around the static probe program (testdata/probe, its entrypoint), labelled
# com.nvidia.volumes.needed=nvidia_driver so that it gets the driver volume.
# It loads it into Docker and into Podman (each where it answers) and saves
# it as bin/gpuiso-probe.tar (docker save format) for gpurun --image.
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/env.sh
tag=gpuiso-probe
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
CGO_ENABLED=0 go build -buildvcs=false -trimpath -o "$ctx/probe" ./testdata/probe
cat >"$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY probe /probe
LABEL com.nvidia.volumes.needed=nvidia_driver
ENTRYPOINT ["/probe"]
DOCKERFILE
mkdir -p bin
# A builder's chatter (Docker's legacy-builder notice) is shown only when it fails.
quiet() { local out; out=$("$@" 2>&1) || { printf '%s\n' "$out" >&2; return 1; }; }
built=
if command -v docker >/dev/null 2>&1 && timeout 10 docker version >/dev/null 2>&1; then
  quiet docker build -q -t "$tag" "$ctx"
  quiet docker save -o bin/gpuiso-probe.tar "$tag"
  echo "probe-image: $tag in Docker" >&2
  built=1
fi
if command -v podman >/dev/null 2>&1; then
  quiet podman build -q -t "$tag" "$ctx"
  # Podman's docker-archive writer refuses an existing file.
  [ -n "$built" ] || { rm -f bin/gpuiso-probe.tar && quiet podman save --format docker-archive -o bin/gpuiso-probe.tar "$tag"; }
  echo "probe-image: $tag in Podman" >&2
  built=1
fi
if [ -z "$built" ]; then
  echo "probe-image: neither Docker nor Podman answers (bash .ci/provision.sh installs both)" >&2
  exit 1
fi
echo "probe-image: bin/gpuiso-probe.tar (for gpurun --image)" >&2
