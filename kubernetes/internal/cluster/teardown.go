package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// cgroupMounts lists the host's cgroup hierarchies (v1 and v2).
func cgroupMounts() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && (f[2] == "cgroup" || f[2] == "cgroup2") {
			out = append(out, f[1])
		}
	}
	return out, sc.Err()
}

// makeCgroups makes the cluster's cgroup and, below it, each node's
// kubelet cgroup root in every v1 hierarchy, with the cpuset's cpus and
// mems copied from the parent; on a cgroup2-only host in the one
// hierarchy, every controller the root offers enabled down to the nodes'
// roots (the kubelet enables them further down itself). A hybrid host's
// cgroup2 holds no controller: the kubelet uses v1 there.
func (c *Cluster) makeCgroups() error {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return err
	}
	names := []string{c.cgroupName}
	for _, n := range c.Nodes {
		names = append(names, n.cgroup)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		unified := len(f) >= 3 && f[2] == "cgroup2" && f[1] == "/sys/fs/cgroup"
		if len(f) < 3 || f[2] != "cgroup" && !unified {
			continue
		}
		for _, name := range names {
			dir := filepath.Join(f[1], name)
			if unified {
				if err := enableControllers(filepath.Dir(dir)); err != nil {
					return err
				}
			}
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			if unified {
				continue
			}
			for _, k := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(filepath.Dir(dir), k))
				if err != nil {
					continue // not the cpuset hierarchy
				}
				if err := os.WriteFile(filepath.Join(dir, k), v, 0o644); err != nil {
					return fmt.Errorf("%s: %w", filepath.Join(dir, k), err)
				}
			}
		}
	}
	return nil
}

// enableControllers enables, in the cgroup2 directory dir, every
// controller it offers for its children.
func enableControllers(dir string) error {
	offered, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return err
	}
	enabled, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return err
	}
	for _, ctl := range strings.Fields(string(offered)) {
		if slices.Contains(strings.Fields(string(enabled)), ctl) {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+"+ctl), 0o644); err != nil {
			return fmt.Errorf("enable %s in %s: %w", ctl, dir, err)
		}
	}
	return nil
}

// Stop tears the cluster down: pods, kubelet, containers, containerd and
// its shims, the control plane, every process left in the cluster's
// cgroups, its mounts, cgroups and directory. It returns what it could
// not do; Leftovers says what remains.
func (c *Cluster) Stop(ctx context.Context) error {
	if !c.owns() {
		return ErrNotStarted
	}
	if c.stopped {
		return nil
	}
	c.stopped = true
	c.deletePods(ctx)
	var kubelets []*proc
	for _, p := range c.procs {
		if strings.HasPrefix(p.name, "kubelet-") {
			kubelets = append(kubelets, p)
		}
	}
	stopAll(kubelets, 15*time.Second)
	var containerds []*proc
	for _, n := range c.Nodes {
		if p := n.containerd; p != nil && !p.exited() {
			c.removeContainers(ctx, n)
			containerds = append(containerds, p)
		}
	}
	stopAll(containerds, 15*time.Second)
	err := c.teardown()
	if c.cfg.Parent != "" {
		err = errors.Join(err, removeHostDirs(c.cfg.Parent))
	}
	return err
}

// stopGrace is how long a process of the cluster has between SIGTERM and
// SIGKILL.
const stopGrace = 10 * time.Second

// deletePods deletes every pod and waits (30 s at most) until the kubelet
// has ended them, so that their claims are unprepared.
func (c *Cluster) deletePods(ctx context.Context) {
	if c.Client == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	nss, err := c.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, ns := range nss.Items {
		c.Client.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(1))}, metav1.ListOptions{})
	}
	for ctx.Err() == nil {
		l, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stopAll stops ps together (SIGTERM, SIGKILL after grace).
func stopAll(ps []*proc, grace time.Duration) {
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(func() { p.stop(grace) })
	}
	wg.Wait()
}

// removeContainers kills and deletes every task and container of node n's
// k8s.io namespace.
func (c *Cluster) removeContainers(ctx context.Context, n *Node) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	out, err := c.CtrOn(ctx, n, nil, "containers", "list", "-q")
	if err != nil {
		return
	}
	for _, id := range strings.Fields(out) {
		c.CtrOn(ctx, n, nil, "tasks", "kill", "-s", "KILL", id)
		for range 50 {
			if _, err := c.CtrOn(ctx, n, nil, "tasks", "delete", id); err == nil || !strings.Contains(err.Error(), "running") {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.CtrOn(ctx, n, nil, "containers", "delete", id)
	}
}

// processes lists the running processes of the cluster that are not its
// recorded ones: shims (their command line names the cluster's
// directory) and processes in its cgroups.
func (c *Cluster) processes() []linux.Process {
	if !c.owns() {
		return nil
	}
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
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if bytes.Contains(cmdline, []byte(c.Dir)) || inCgroup(string(cg), c.cgroupName) {
			out = append(out, linux.Process{Pid: pid, Start: st.Start})
		}
	}
	return out
}

// inCgroup reports whether a /proc/<pid>/cgroup content places the process
// at or below /name in some hierarchy.
func inCgroup(content, name string) bool {
	for _, l := range strings.Split(content, "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) == 3 && (parts[2] == "/"+name || strings.HasPrefix(parts[2], "/"+name+"/")) {
			return true
		}
	}
	return false
}

// killStragglers kills the cluster's processes that are not its recorded
// ones (shims, pods) until none is left, 20 s at most.
func (c *Cluster) killStragglers() error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		var ps []linux.Process
		for _, p := range c.processes() {
			if !slices.ContainsFunc(c.procs, func(r *proc) bool { return r.id == p }) {
				ps = append(ps, p)
			}
		}
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

// mounts lists the mount points at or below the cluster's directory in
// the host's mount namespace.
func (c *Cluster) mounts() ([]string, error) {
	if !c.owns() {
		return nil, nil
	}
	return mountsIn("/proc/self/mountinfo", c.Dir)
}

func mountsIn(mountinfo, dir string) ([]string, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return linux.ParseMountPoints(f, dir)
}

// nodeMounts lists the mount points at or below the cluster's directory
// in the mount namespaces of its nodes that are still alive (a node's
// namespace goes with its last process).
func (c *Cluster) nodeMounts() []string {
	var out []string
	for _, n := range c.Nodes {
		if n.containerd == nil || !linux.Alive("", n.containerd.id) {
			continue
		}
		ms, _ := mountsIn(fmt.Sprintf("/proc/%d/mountinfo", n.containerd.id.Pid), c.Dir)
		for _, m := range ms {
			out = append(out, m+" (node "+n.Name+")")
		}
	}
	return out
}

// unmountAll unmounts everything under the cluster's directory, children
// first.
func (c *Cluster) unmountAll() error {
	for range 20 {
		ms, err := c.mounts()
		if err != nil {
			return err
		}
		if len(ms) == 0 {
			return nil
		}
		for i := len(ms) - 1; i >= 0; i-- {
			linux.DetachUnmount(ms[i])
		}
	}
	ms, _ := c.mounts()
	return fmt.Errorf("mounts left: %v", ms)
}

// cgroupDirs lists the cluster's cgroups that exist, children first.
func (c *Cluster) cgroupDirs() []string {
	if !c.owns() {
		return nil
	}
	roots, _ := cgroupMounts()
	return cgroupTree(roots, c.cgroupName)
}

// cgroupTree lists the cgroup name and those below it that exist under
// each of roots, children first.
func cgroupTree(roots []string, name string) []string {
	var out []string
	for _, r := range roots {
		var dirs []string
		filepath.WalkDir(filepath.Join(r, name), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		slices.Reverse(dirs)
		out = append(out, dirs...)
	}
	return out
}

// removeCgroups removes the cluster's cgroups, 10 s at most.
func (c *Cluster) removeCgroups() error {
	return removeCgroupDirs(c.cgroupDirs)
}

// removeCgroupDirs removes the cgroups dirs lists, children first, until
// it lists none, 10 s at most (a cgroup whose last process is exiting is
// busy for a moment).
func removeCgroupDirs(dirs func() []string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		list := dirs()
		if len(list) == 0 {
			return nil
		}
		var errs []error
		for _, d := range list {
			if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		if len(errs) == 0 {
			continue
		}
		if time.Now().After(deadline) {
			return errors.Join(errs...)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Leftovers lists what of the cluster still exists on the host: its
// processes, mounts, cgroups and directory. After Stop, none.
func (c *Cluster) Leftovers() []string {
	var out []string
	for _, p := range c.procs {
		if linux.Alive("", p.id) {
			out = append(out, fmt.Sprintf("process %s (%s)", p.name, p.id))
		}
	}
	for _, p := range c.processes() {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.Pid))
		out = append(out, fmt.Sprintf("process %s: %s", p, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
	}
	ms, err := c.mounts()
	if err != nil {
		out = append(out, "mountinfo: "+err.Error())
	}
	for _, m := range append(ms, c.nodeMounts()...) {
		out = append(out, "mount "+m)
	}
	for _, d := range c.cgroupDirs() {
		out = append(out, "cgroup "+d)
	}
	if _, err := os.Lstat(c.Dir); err == nil {
		out = append(out, "directory "+c.Dir)
	}
	if c.cfg.Parent != "" && !otherClusters(c.cfg.Parent) {
		for _, d := range madeHostDirs(c.cfg.Parent) {
			if entries, err := os.ReadDir(d); err == nil && len(entries) == 0 {
				out = append(out, "host directory "+d)
			}
		}
	}
	return out
}
