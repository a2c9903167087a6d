package vmtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
)

// Machine is a qemu virtual machine as the suite boots it: x86-64 under
// TCG (no KVM), a kernel booted directly with an initramfs, its vCPUs and
// memory spread evenly over NUMA nodes, a virtio console on qemu's
// standard output, the kernel's log in a file, and host directories shared
// over 9p.
type Machine struct {
	// QEMU is the qemu-system-x86_64 binary (default: from PATH).
	QEMU string
	// Kernel is an uncompressed ELF kernel (booted through PVH) or a bzImage.
	Kernel string
	// Initrd is the initramfs (a newc cpio archive).
	Initrd string
	// Cmdline is the kernel's command line.
	Cmdline []string
	// CPUs is the number of vCPUs (at least NUMANodes).
	CPUs int
	// NUMANodes is the number of NUMA nodes (at least 1): node i gets
	// the vCPUs i*CPUs/NUMANodes up to (i+1)*CPUs/NUMANodes-1 and an
	// equal share of the memory.
	NUMANodes int
	// MemoryMiB is the memory in MiB, a multiple of NUMANodes.
	MemoryMiB int
	// Shares are host directories the guest mounts with
	// "mount -t 9p -o trans=virtio <tag> <dir>".
	Shares []Share
	// KernelLog is the file that receives the kernel's log (the first
	// serial port); empty means none.
	KernelLog string
}

// Share is a host directory shared with the guest over 9p.
type Share struct {
	Tag      string
	Path     string
	ReadOnly bool
}

// Args returns qemu's arguments for m.
func (m Machine) Args() ([]string, error) {
	switch {
	case m.Kernel == "" || m.Initrd == "":
		return nil, errors.New("vm: no kernel or initramfs")
	case m.NUMANodes < 1 || m.CPUs < m.NUMANodes:
		return nil, fmt.Errorf("vm: %d vCPUs on %d NUMA nodes: want at least one vCPU per node", m.CPUs, m.NUMANodes)
	case m.MemoryMiB <= 0 || m.MemoryMiB%m.NUMANodes != 0:
		return nil, fmt.Errorf("vm: %d MiB over %d NUMA nodes: want an equal share each", m.MemoryMiB, m.NUMANodes)
	}
	args := []string{
		"-machine", "q35", "-accel", "tcg", "-cpu", "max",
		"-m", strconv.Itoa(m.MemoryMiB) + "M", "-smp", strconv.Itoa(m.CPUs),
		"-kernel", m.Kernel, "-initrd", m.Initrd, "-append", strings.Join(m.Cmdline, " "),
		"-nographic", "-no-reboot", "-nic", "none", "-monitor", "none",
		"-device", "virtio-serial-pci", "-chardev", "stdio,id=con,signal=off", "-device", "virtconsole,chardev=con",
	}
	for i := range m.NUMANodes {
		first, last := i*m.CPUs/m.NUMANodes, (i+1)*m.CPUs/m.NUMANodes-1
		cpus := strconv.Itoa(first)
		if last > first {
			cpus += "-" + strconv.Itoa(last)
		}
		args = append(args,
			"-object", fmt.Sprintf("memory-backend-ram,id=mem%d,size=%dM", i, m.MemoryMiB/m.NUMANodes),
			"-numa", fmt.Sprintf("node,nodeid=%d,cpus=%s,memdev=mem%d", i, cpus, i))
	}
	serial := "none"
	if m.KernelLog != "" {
		serial = "file:" + m.KernelLog
	}
	args = append(args, "-serial", serial)
	for _, s := range m.Shares {
		if s.Tag == "" || strings.ContainsAny(s.Tag+s.Path, ",") {
			return nil, fmt.Errorf("vm: share %q at %q: want a tag, and no comma in either", s.Tag, s.Path)
		}
		opt := fmt.Sprintf("local,path=%s,mount_tag=%s,security_model=none,multidevs=remap", s.Path, s.Tag)
		if s.ReadOnly {
			opt += ",readonly=on"
		}
		args = append(args, "-virtfs", opt)
	}
	return args, nil
}

// Run boots m and waits until the guest powers off (or ctx ends, which
// kills qemu). Each line the guest writes to its console goes to line, in
// order, from one goroutine. The error is qemu's: a guest that powers off
// cleanly, whatever its tests did, is a nil error.
func (m Machine) Run(ctx context.Context, line func(string)) error {
	args, err := m.Args()
	if err != nil {
		return err
	}
	bin := m.QEMU
	if bin == "" {
		bin = "qemu-system-x86_64"
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("vm: start %s: %w", bin, err)
	}
	r := bufio.NewReaderSize(out, 64<<10)
	for {
		l, err := r.ReadString('\n')
		if l != "" {
			line(strings.TrimRight(l, "\r\n"))
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				line("vmtest: console: " + err.Error())
			}
			break
		}
	}
	if err := cmd.Wait(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("vm: %w (qemu killed)", ctx.Err())
		}
		return fmt.Errorf("vm: qemu: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return nil
}
