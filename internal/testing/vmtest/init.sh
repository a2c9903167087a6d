#!/bin/busybox sh
# The init of gpuiso's cgroup2-only test VM (see package vmtest).
#
# Stage 1 runs as pid 1 from the initramfs: it loads the modules for the
# virtio console and 9p, builds the real root on a tmpfs (runc's pivot_root
# cannot leave the initramfs), with the parts of the host's /usr that
# $VMTEST_USR names bound read-only from its 9p share (the host's programs
# and libraries, NVIDIA's user-space driver included; not the rest, which a
# container's walk of its root would have to stat over 9p), a copy of the
# host's /etc and the 9p shares of /vm.env, and switches to it.
# Stage 2 mounts what a cgroup2-only host has (cgroup2 alone, with
# nsdelegate; bpffs; devpts), runs $VMTEST_COMMAND, says how it ended and
# powers off.
set -u
bb=/bin/busybox
[ -x /.vm/busybox ] && bb=/.vm/busybox
say() { echo "vmtest: $*"; }

stage1() {
  $bb mount -t proc proc /proc
  $bb mount -t sysfs sys /sys
  $bb mount -t devtmpfs dev /dev
  for m in $($bb cat /modules.order); do
    $bb insmod "/modules/$m.ko" || say "insmod $m failed"
  done
  i=0
  while [ ! -e /dev/hvc0 ] && [ $i -lt 200 ]; do $bb usleep 20000; i=$((i + 1)); done
  exec </dev/null >/dev/hvc0 2>&1
  . /vm.env
  r=/newroot
  $bb mkdir -p $r
  $bb mount -t tmpfs -o mode=0755 root $r
  $bb mkdir -p $r/usr $r/proc $r/sys $r/dev $r/tmp $r/run $r/var/tmp $r/var/lib $r/root $r/.vm
  $bb chmod 1777 $r/tmp $r/var/tmp
  for l in bin sbin lib lib64; do $bb ln -s usr/$l $r/$l; done
  # 9p: a big msize for the test binaries; cache=loose for the read-only
  # shares (nothing changes under them while the VM runs).
  o=trans=virtio,version=9p2000.L,msize=524288
  $bb mkdir -p /usrall
  $bb mount -t 9p -o $o,cache=loose,ro usr /usrall || { say "mount usr failed"; $bb poweroff -f; }
  $bb mount -t tmpfs -o mode=0755 usr $r/usr
  for d in $VMTEST_USR; do
    [ -d "/usrall/$d" ] || continue
    $bb mkdir -p "$r/usr/$d"
    $bb mount --bind "/usrall/$d" "$r/usr/$d"
  done
  for f in $VMTEST_HIDE; do
    [ -e "$r/usr/$f" ] && $bb mount --bind /dev/null "$r/usr/$f"
  done
  $bb mount -o remount,ro "$r/usr"
  $bb umount -l /usrall
  for s in $VMTEST_SHARES; do
    tag=${s%%:*} rest=${s#*:}
    dir=${rest%%:*} mode=${rest#*:}
    $bb mkdir -p "$r$dir"
    if [ "$mode" = ro ]; then
      $bb mount -t 9p -o $o,cache=loose,ro "$tag" "$r$dir" || say "mount $tag failed"
    else
      $bb mount -t 9p -o $o "$tag" "$r$dir" || say "mount $tag failed"
    fi
  done
  $bb cp -a /etc $r/etc
  $bb cp /bin/busybox /init /vm.env $r/.vm/
  $bb umount /proc /sys
  $bb mount --move /dev $r/dev
  exec $bb switch_root $r /.vm/busybox sh /.vm/init stage2
}

stage2() {
  exec </dev/null >/dev/hvc0 2>&1
  $bb mount -t proc proc /proc
  $bb mount -t sysfs sys /sys
  $bb mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
  $bb mount -t bpf bpf /sys/fs/bpf
  $bb mkdir -p /dev/pts /dev/shm
  $bb mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
  $bb ln -sf pts/ptmx /dev/ptmx
  $bb mount -t tmpfs -o mode=1777 shm /dev/shm
  $bb mount -t tmpfs -o mode=1777 tmp /tmp
  $bb mount -t tmpfs -o mode=0755 run /run
  [ -e /dev/fd ] || $bb ln -s /proc/self/fd /dev/fd
  $bb hostname gpuiso-vm
  $bb ip link set lo up
  . /.vm/vm.env
  export HOME=/root TMPDIR=/tmp
  export PATH=$VMTEST_PATH
  say "up $($bb cut -d' ' -f1 /proc/uptime) s: $($bb uname -r), cgroup2 controllers: $($bb cat /sys/fs/cgroup/cgroup.controllers), NUMA nodes: $($bb ls /sys/devices/system/node | $bb grep -c '^node')"
  cd "${VMTEST_DIR:-/}"
  sh -c "$VMTEST_COMMAND"
  rc=$?
  say "exit $rc"
  $bb sync
  $bb poweroff -f
}

case "${1:-stage1}" in
  stage2) stage2 ;;
  *) stage1 ;;
esac
