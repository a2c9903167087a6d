package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// ownerFile names, in a cluster's directory, the process that started it
// ("<pid>.<start>").
const ownerFile = "owner"

// writeOwner records the calling process as the cluster's owner.
func (c *Cluster) writeOwner() error {
	self, err := linux.Self("")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.Dir, ownerFile), []byte(self.String()), 0o600)
}

// Reap tears down the clusters under parent whose owner is dead: what a
// test process killed before its Stop (SIGKILL, a timeout) left: its
// processes (the control plane and kubelet die with their owner;
// containerd's shims and the pods do not), mounts, cgroups and directory.
// A cluster without an owner file yet is left alone. It returns the
// directories it reaped.
func Reap(parent string) ([]string, error) {
	entries, err := os.ReadDir(parent)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var reaped []string
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "k8s-") {
			continue
		}
		dir := filepath.Join(parent, e.Name())
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		owner, err := linux.ParseProcess(strings.TrimSpace(string(b)))
		if err != nil || !linux.Dead("", owner) {
			continue
		}
		c := &Cluster{Dir: dir, cgroupName: "gpuiso-" + e.Name()}
		errs = append(errs, c.teardown())
		reaped = append(reaped, dir)
	}
	if err := errors.Join(errs...); err != nil {
		return reaped, fmt.Errorf("reap stale clusters: %w", err)
	}
	return reaped, nil
}

// teardown is Stop's part that needs none of the cluster's servers: kill
// its processes, unmount, remove its cgroups and directory.
func (c *Cluster) teardown() error {
	if !c.owns() {
		return ErrNotStarted
	}
	var errs []error
	if err := c.killStragglers(); err != nil {
		errs = append(errs, err)
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].stop(stopGrace)
	}
	if err := c.unmountAll(); err != nil {
		errs = append(errs, err)
	}
	if err := c.removeCgroups(); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
