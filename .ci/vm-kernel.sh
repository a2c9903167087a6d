#!/usr/bin/env bash
# Fetches what the cgroup2-only VM suite (internal/testing/vmtest) boots: Debian's
# own kernel and a static busybox, from their .debs (apt-get download,
# unpacked with dpkg-deb -x: nothing is installed), into a cache directory
# (default /var/cache/gpuiso/vm). qemu-system-x86 itself is a package that
# provision.sh installs. Idempotent: once the cache holds a kernel, a second
# run changes nothing and needs no network.
#
# The cache then holds:
#   vmlinux         the kernel as an uncompressed ELF (qemu boots it through
#                   PVH, seconds faster than the bzImage under TCG)
#   modules/        the kernel's modules tree (lib/modules/<version>)
#   busybox         a static busybox
#   config          the kernel's configuration
#   release         the kernel's version; written last, so that its presence
#                   means the rest is complete
#
#   vm-kernel.sh [DIR]
set -euo pipefail

dir=${1:-/var/cache/gpuiso/vm}
log() { printf 'vm-kernel: %s\n' "$*" >&2; }

if [ -s "$dir/release" ] && [ -f "$dir/vmlinux" ] && [ -x "$dir/busybox" ]; then
  exit 0
fi
mkdir -p "$dir"
work=$(mktemp -d "$dir/.fetch-XXXXXX")
trap 'rm -rf "$work"' EXIT

# The kernel linux-image-amd64 stands for now: linux-image-6.1.0-NN-amd64.
pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -n1)
if [ -z "$pkg" ]; then
  apt-get update -qq
  pkg=$(apt-cache depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -n1)
fi
[ -n "$pkg" ] || { log "no linux-image-*-amd64 behind linux-image-amd64 in apt's lists"; exit 1; }
log "fetching $pkg and busybox-static"
# apt's sandbox user cannot write into a root-only directory.
chmod 0755 "$work"
(cd "$work" && apt-get download -q "$pkg" busybox-static >/dev/null 2>&1) ||
  (apt-get update -qq && cd "$work" && apt-get download -q "$pkg" busybox-static >/dev/null)
mkdir "$work/x"
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$work/x"; done

release=${pkg#linux-image-}
bz="$work/x/boot/vmlinuz-$release"
[ -f "$bz" ] || { log "$pkg holds no /boot/vmlinuz-$release"; exit 1; }
# The bzImage's payload is xz: cut it at the xz magic and decompress (xz
# complains of the bytes after the stream, which are not the kernel's).
off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$bz" | head -n1 | cut -d: -f1)
[ -n "$off" ] || { log "no xz stream in $bz"; exit 1; }
tail -c +$((off + 1)) "$bz" | xz -dcq >"$work/vmlinux" 2>/dev/null || true
head -c 4 "$work/vmlinux" | grep -q ELF || { log "the xz stream of $bz is not an ELF kernel"; exit 1; }

rm -rf "$dir/modules" "$dir/vmlinux" "$dir/busybox" "$dir/config" "$dir/release"
mv "$work/x/lib/modules/$release" "$dir/modules"
mv "$work/vmlinux" "$dir/vmlinux"
mv "$work/x/bin/busybox" "$dir/busybox"
mv "$work/x/boot/config-$release" "$dir/config"
printf '%s\n' "$release" >"$dir/release"
log "kernel $release and busybox in $dir"
