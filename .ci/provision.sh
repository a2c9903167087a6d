#!/usr/bin/env bash
# Provisions a Debian (bookworm) test host for gpuiso's full test suite.
# Idempotent: every step checks before it changes anything. Needs root.
#
#   provision.sh                everything the full test command needs (make included)
#   provision.sh --driver-only  only what the README's first command (the
#                               demo) needs: the NVIDIA user-space driver and
#                               a C compiler for cgo; no Docker
#   provision.sh --no-start     everything, but start no daemon (to fetch
#                               and build while the network is there, for a
#                               run that has none)
set -euo pipefail

driver_only=0 start=1
case "${1:-}" in
  "") ;;
  --driver-only) driver_only=1 ;;
  --no-start) start=0 ;;
  *) printf 'provision: unknown argument %s (want --driver-only, --no-start or nothing)\n' "$1" >&2; exit 2 ;;
esac

log() { printf 'provision: %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  log "must run as root (the full suite needs cgroups, mknod and dockerd)"
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes

# 1. Debian's non-free component, where the NVIDIA user-space driver lives (and contrib,
#    which holds its glue packages: nvidia-support, nvidia-legacy-check, glx-alternative-nvidia).
src=/etc/apt/sources.list.d/gpuiso-non-free.sources
want='Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg'
updated=0
if [ ! -f "$src" ] || [ "$(cat "$src")" != "$want" ]; then
  log "adding $src"
  printf '%s\n' "$want" >"$src"
  apt-get update -qq
  updated=1
fi

# 2. Packages: NVML, libcuda, nvidia-smi (no kernel module: none can load here), what
#    go needs to build cgo and fetch modules, Docker, and Podman (a CDI runtime for
#    the CDI suite).
pkgs=(libnvidia-ml1 libcuda1 nvidia-smi gcc libc6-dev ca-certificates make)
# nvidia-cuda-mps: the MPS control daemon that enforces GPU shares (same source as
# the driver libraries; it runs without a GPU, its server starts with a client).
pkgs+=(nvidia-cuda-mps)
# git: make check lists the sources with git ls-files.
[ "$driver_only" -eq 1 ] || pkgs+=(git)
# iproute2: the tests give a second dockerd a bridge of its own with ip(8).
[ "$driver_only" -eq 1 ] || pkgs+=(docker.io podman iproute2)
# libseccomp-dev: runc 1.3, built by current-docker.sh (step 4), links it,
# and finds it with pkg-config (not installed with it on a minimal Debian).
[ "$driver_only" -eq 1 ] || pkgs+=(libseccomp-dev pkg-config)
# qemu-system-x86: the cgroup2-only VM suite (internal/testing/vmtest) boots Debian's
# own kernel under it (step 5).
[ "$driver_only" -eq 1 ] || pkgs+=(qemu-system-x86)
# protobuf-compiler: make check regenerates the nomad/ module's protocol code
# with protoc and fails when it differs from what is committed.
[ "$driver_only" -eq 1 ] || pkgs+=(protobuf-compiler)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$updated" -eq 1 ] || apt-get update -qq
  log "installing ${missing[*]}"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ "$driver_only" -eq 1 ]; then
  log "host ready: NVIDIA user-space driver $(dpkg-query -W -f='${Version}' libnvidia-ml1)"
  exit 0
fi

# 3. A Docker daemon that answers.
docker_cli=/usr/bin/docker
if [ "$start" -eq 1 ] && ! timeout 10 "$docker_cli" version >/dev/null 2>&1; then
  log "starting dockerd"
  mkdir -p /var/log
  setsid nohup /usr/sbin/dockerd >/var/log/gpuiso-dockerd.log 2>&1 </dev/null &
  for _ in $(seq 1 60); do
    timeout 5 "$docker_cli" version >/dev/null 2>&1 && break
    sleep 1
  done
  if ! timeout 10 "$docker_cli" version >/dev/null 2>&1; then
    log "dockerd did not answer within 60 s; its log:"
    tail -n 30 /var/log/gpuiso-dockerd.log >&2 || true
    exit 1
  fi
fi
# 4. A current Docker daemon (API 1.44+, Docker's CDI path), containerd 2
#    and runc 1.3, built once from the Go module proxy into
#    /var/cache/gpuiso/bin and kept (minutes, the first time only). It is
#    started beside the host's daemon by the tests that need it, never
#    instead of it.
bash "$(dirname "$0")/current-docker.sh" >/dev/null
# 5. Debian's kernel and a static busybox for the cgroup2-only VM suite,
#    fetched once into /var/cache/gpuiso/vm (nothing installed).
bash "$(dirname "$0")/vm-kernel.sh"
if [ "$start" -eq 0 ]; then
  log "host ready, no daemon started: NVIDIA user-space driver $(dpkg-query -W -f='${Version}' libnvidia-ml1), a current dockerd in /var/cache/gpuiso/bin"
  exit 0
fi
log "host ready: NVIDIA user-space driver $(dpkg-query -W -f='${Version}' libnvidia-ml1), docker $("$docker_cli" version --format '{{.Server.Version}}'), a current dockerd in /var/cache/gpuiso/bin"
