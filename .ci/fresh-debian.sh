#!/usr/bin/env bash
# Runs the README's two commands, as printed, on a fresh Debian 12 that has
# nothing but Go: a minbase debootstrap chroot with this host's /usr/local/go
# copied in and a clone of the committed tree (HEAD) at /root/gpuiso, as a
# user gets it (make check lists the sources with git ls-files). The
# test command runs in a network namespace of its own, so that the dockerd it
# starts there never meets this host's. Root only; it leaves the chroot in
# DIR (default /var/tmp/gpuiso-deb12) for inspection and removes nothing of
# the host. Fails if either command fails or prints a compiler warning.
#
#   .ci/fresh-debian.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/var/tmp/gpuiso-deb12}
log() { printf 'fresh-debian: %s\n' "$*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "must run as root (debootstrap, chroot, mounts)"; exit 1; }
command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
if [ ! -x "$dir/bin/bash" ]; then
  log "debootstrap bookworm into $dir"
  debootstrap --variant=minbase bookworm "$dir" http://deb.debian.org/debian >"$dir.debootstrap.log" 2>&1
fi
[ -x "$dir/usr/local/go/bin/go" ] || cp -a /usr/local/go "$dir/usr/local/go"
rm -rf "$dir/root/gpuiso"
git clone -q --no-hardlinks "$PWD" "$dir/root/gpuiso"
git -C "$dir/root/gpuiso" checkout -q --detach "$(git rev-parse HEAD)"
cp /etc/resolv.conf "$dir/etc/resolv.conf"
# This host's extra certificate authorities (a proxy's, which a real network
# does not need); Debian's ca-certificates takes them in when provisioning
# installs it.
if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
  mkdir -p "$dir/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/"
fi
# No service starts from a package's scripts inside the chroot.
printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"; chmod +x "$dir/usr/sbin/policy-rc.d"

# The test step's mount namespace, once it has one (see below).
mntns=
cleanup() {
  for p in /proc/[0-9]*; do
    if [ "$(readlink "$p/root" 2>/dev/null)" = "$dir" ] ||
      { [ -n "$mntns" ] && [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$mntns" ]; }; then
      kill -TERM "${p#/proc/}" 2>/dev/null || true
    fi
  done
  sleep 5
  umount -R "$dir" 2>/dev/null || true
}
trap cleanup EXIT
mount --bind "$dir" "$dir"   # / must be a mount point, as on a real host
for m in proc sys dev; do mount --rbind "/$m" "$dir/$m"; mount --make-rslave "$dir/$m"; done
in_chroot() {
  chroot "$dir" /usr/bin/env -i HOME=/root TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /bin/bash -c "cd /root/gpuiso && $1"
}
status=0
log "the main job: bash .ci/demo.sh"
in_chroot 'bash .ci/demo.sh' >"$dir.demo.log" 2>&1 || status=1
log "demo: $([ $status -eq 0 ] && echo passed || echo FAILED), log $dir.demo.log"
# What the test command downloads (Debian packages, Go modules, the sources
# of the pinned Docker and Kubernetes builds) needs the network: fetch and
# build it first, here, so that the test command itself can run where its
# dockerd is alone. The test command then finds it all in place, as on a
# host where it ran before.
log "prepare: packages, modules, the pinned builds (log $dir.prepare.log)"
# Provisioning's own package list is used, so that a package it forgets
# shows here.
in_chroot 'set -e; export PATH=$PATH:/usr/local/go/bin
bash .ci/provision.sh --no-start
go mod download && (cd kubernetes && go mod download)
bash .ci/k8s-build.sh
bash .ci/helm-build.sh' >"$dir.prepare.log" 2>&1 || { log "prepare: FAILED"; status=1; }
log "the tests: bash .ci/test.sh"
# The test step gets a network and a mount namespace of its own, with the
# chroot made the namespace's real root (pivot_root, not chroot): the
# dockerd it starts then runs containers as on a real host (runc's exec
# joins a container's mount namespace and finds the container's root there,
# which a chrooted daemon's containers do not have).
rm -f "$dir.mntns"
unshare -n -m sh -c "set -e
  ip link set lo up
  mount --make-rprivate /
  readlink /proc/self/ns/mnt >'$dir.mntns'
  cd '$dir' && mkdir -p .host-root && pivot_root . .host-root
  cd / && umount -l /.host-root && rmdir /.host-root
  exec /usr/bin/env -i HOME=/root TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /bin/bash -c 'cd /root/gpuiso && bash .ci/test.sh'" >"$dir.test.log" 2>&1 &
test_pid=$!
for _ in 1 2 3 4 5 6 7 8 9 10; do [ -s "$dir.mntns" ] && break; sleep 0.2; done
mntns=$(cat "$dir.mntns" 2>/dev/null || true)
if wait "$test_pid"; then
  log "tests: passed, log $dir.test.log"
else
  log "tests: FAILED, log $dir.test.log"; status=1
fi
if grep -E 'warning: |\[-W[a-z-]+\]' "$dir.demo.log" "$dir.test.log" >&2; then
  log "a compiler warning was printed"; status=1
fi
exit $status
