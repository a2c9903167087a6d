package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// Reboot reboots node n as a power cut and a boot would: its kubelet, its
// containerd, their shims and every process of its pods (any process
// whose command line names the node's directory or that runs in its
// cgroups) get SIGKILL, which ends the node's mount namespace and every
// mount in it; what a node keeps under /run (containerd's state, runc's
// root, the shim sockets, the CDI spec directory) is emptied and its
// cgroups are made afresh, while what it keeps on disk (containerd's root
// with its images and container records, the kubelet's root with its
// checkpoints, the plugin state directory) stays. containerd and the
// kubelet then start again, and Reboot returns once the kubelet has
// reported the Node Ready since. The pods of the node are the kubelet's
// to start again, as after a real reboot; a program the caller runs
// beside the node with the node's directory in its command line (a
// kubelet plugin run as a process) dies with it and is the caller's to
// start again.
func (c *Cluster) Reboot(ctx context.Context, n *Node) error {
	if !c.owns() || n == nil || !slices.Contains(c.Nodes, n) {
		return ErrNotStarted
	}
	if c.stopped {
		return fmt.Errorf("reboot node %s: %w", n.Name, ErrNotStarted)
	}
	if err := c.powerOff(n); err != nil {
		return fmt.Errorf("reboot node %s: %w", n.Name, err)
	}
	var errs []error
	for _, d := range []string{n.CDIDir, filepath.Join(n.Dir, "containerd", "state"), filepath.Join(n.Dir, "runc"), c.shimDir(n)} {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.removeNodeCgroups(n); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("reboot node %s: %w", n.Name, err)
	}
	for d, mode := range map[string]os.FileMode{n.CDIDir: 0o755, filepath.Join(n.Dir, "runc"): 0o755, c.shimDir(n): 0o700} {
		if err := os.MkdirAll(d, mode); err != nil {
			return fmt.Errorf("reboot node %s: %w", n.Name, err)
		}
	}
	if err := c.makeCgroups(); err != nil {
		return fmt.Errorf("reboot node %s: %w", n.Name, err)
	}
	// The Node's heartbeats have a resolution of a second: one from the
	// kubelet started now is later than this.
	booted := time.Now().Truncate(time.Second).Add(time.Second)
	if err := c.startContainerd(ctx, n); err != nil {
		return fmt.Errorf("reboot node %s: %w", n.Name, err)
	}
	if err := c.startKubelet(n); err != nil {
		return fmt.Errorf("reboot node %s: %w", n.Name, err)
	}
	err := c.until(ctx, "node "+n.Name+" to be Ready after its reboot", func() bool {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue && !cond.LastHeartbeatTime.Time.Before(booted)
			}
		}
		return false
	})
	if err != nil {
		return fmt.Errorf("reboot node %s: %w", n.Name, err)
	}
	return nil
}

// powerOff kills node n's kubelet and containerd, then every other process
// of the node, until none is left (20 s at most), and forgets the two.
func (c *Cluster) powerOff(n *Node) error {
	kubelet := "kubelet-" + n.short()
	var ours []*proc
	for _, p := range c.procs {
		if p == n.containerd || p.name == kubelet {
			ours = append(ours, p)
			if !p.exited() {
				p.cmd.Process.Kill()
			}
		}
	}
	for _, p := range ours {
		<-p.done
	}
	c.procs = slices.DeleteFunc(c.procs, func(p *proc) bool { return slices.Contains(ours, p) })
	n.containerd = nil
	deadline := time.Now().Add(20 * time.Second)
	for {
		ps := c.nodeProcesses(n)
		if len(ps) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes left: %v", ps)
		}
		for _, p := range ps {
			if linux.Alive("", p) {
				linux.Kill(p.Pid)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// nodeProcesses lists the running processes of node n that are not the
// cluster's recorded ones: those whose command line names the node's
// directory (shims) and those in its cgroups (pods).
func (c *Cluster) nodeProcesses(n *Node) []linux.Process {
	entries, _ := os.ReadDir("/proc")
	var out []linux.Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		st, err := linux.ReadProcStat("", pid)
		if err != nil || st.Exited() {
			continue
		}
		p := linux.Process{Pid: pid, Start: st.Start}
		if slices.ContainsFunc(c.procs, func(r *proc) bool { return r.id == p }) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if bytes.Contains(cmdline, []byte(n.Dir+"/")) || inCgroup(string(cg), n.cgroup) {
			out = append(out, p)
		}
	}
	return out
}

// removeNodeCgroups removes node n's cgroups (its kubelet's root and the
// pods' below it) in every hierarchy, 10 s at most.
func (c *Cluster) removeNodeCgroups(n *Node) error {
	roots, err := cgroupMounts()
	if err != nil {
		return err
	}
	return removeCgroupDirs(func() []string { return cgroupTree(roots, n.cgroup) })
}
