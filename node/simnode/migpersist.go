package simnode

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/record"
)

// migLayoutPath is where a MIGManager with a host tree records the MIG
// layouts it changed, in the tree's proc side (gone with the tree), so
// that the node made again over the same tree (a program restarted, as
// the real driver keeps its instances) has them: RestoreMIG.
func migLayoutPath(h *Host) string {
	return filepath.Join(h.ProcRoot, "driver", "nvidia", "gpuiso-sim-mig-layout.json")
}

// savedLayouts are the MIG layouts of a node's GPUs with MIG enabled, by
// index.
type savedLayouts struct {
	GPUs map[string][]MIGInstance `json:"gpus"`
}

// The record of the layouts is an entry of package record, of format
// "gpuiso-sim-mig-layout", version 2; version 1, the layouts' JSON alone,
// is read still.
const (
	migLayoutFormat  = "gpuiso-sim-mig-layout"
	migLayoutVersion = 2
	migLayoutKey     = "gpuiso-sim-mig-layout"
)

// migLayoutFile is the record of the layouts of host tree h. It is
// readable by all (as the tree's proc side is) and synced, as the real
// driver's state outlives a program.
func migLayoutFile(h *Host) (*record.File[savedLayouts], error) {
	return record.NewFile(migLayoutPath(h), migLayoutKey, record.Options[savedLayouts]{
		Format: migLayoutFormat, Version: migLayoutVersion, Legacy: legacyLayouts, Perm: 0o644,
	})
}

// legacyLayouts reads a record of version 1: the layouts alone.
func legacyLayouts(b []byte) (record.Entry[savedLayouts], error) {
	var saved savedLayouts
	if err := json.Unmarshal(b, &saved); err != nil {
		return record.Entry[savedLayouts]{}, err
	}
	return record.Entry[savedLayouts]{Phase: record.Completed, Version: 1, Data: saved}, nil
}

// saveLayoutLocked records the layout of every GPU with MIG enabled, GPU
// i's being next, in h. The caller holds n.mu.
func (n *Node) saveLayoutLocked(h *Host, i int, next []*migInstance) error {
	out := savedLayouts{GPUs: map[string][]MIGInstance{}}
	for k := range n.mig {
		if !n.mig[k].enabled {
			continue
		}
		ins := n.mig[k].instances
		if k == i {
			ins = next
		}
		layout := []MIGInstance{}
		for _, in := range ins {
			layout = append(layout, MIGInstance{Profile: in.profile.name, Start: &in.start})
		}
		out.GPUs[strconv.Itoa(k)] = layout
	}
	f, err := migLayoutFile(h)
	if err == nil {
		err = f.Write(record.Entry[savedLayouts]{Phase: record.Completed, Data: out})
	}
	if err != nil {
		return fmt.Errorf("record the simulated MIG layout: %w", err)
	}
	return nil
}

// RestoreMIG gives the node the MIG layouts that a MIGManager with host
// tree h recorded (the MIG devices made and destroyed since the tree was
// made), as the real driver keeps a GPU's instances when a program
// restarts; call it before discovery. A tree without a record changes
// nothing. A record that does not read, or names a GPU without MIG or a
// layout that breaks the GPU's rules, is an error (ErrMIGLayout) and
// changes nothing. A nil h is refused (node.ErrInvalid).
func (n *Node) RestoreMIG(h *Host) error {
	if h == nil {
		return fmt.Errorf("simulated MIG layout: no host tree: %w", node.ErrInvalid)
	}
	f, err := migLayoutFile(h)
	if err != nil {
		return fmt.Errorf("simulated MIG layout: %w", err)
	}
	e, err := f.Read()
	if errors.Is(err, record.ErrNoRecord) {
		return nil
	}
	if errors.Is(err, record.ErrCorrupt) {
		return fmt.Errorf("simulated MIG layout %s: %w: %w", migLayoutPath(h), ErrMIGLayout, err)
	}
	if err != nil {
		return err
	}
	saved := e.Data
	table := n.spec.profiles()
	layouts := map[int][]placed{}
	n.mu.Lock()
	defer n.mu.Unlock()
	for key, layout := range saved.GPUs {
		i, err := strconv.Atoi(key)
		if err != nil || i < 0 || i >= len(n.mig) || !n.mig[i].enabled {
			return fmt.Errorf("simulated MIG layout: GPU %q has no MIG enabled: %w", key, ErrMIGLayout)
		}
		ps, err := placeAll(table, layout)
		if err != nil {
			return fmt.Errorf("simulated MIG layout of GPU %d: %w", i, err)
		}
		layouts[i] = ps
	}
	for i, ps := range layouts {
		var ins []*migInstance
		for _, p := range ps {
			ins = append(ins, n.newInstance(i, p.profile, p.start))
		}
		sortInstances(ins)
		n.mig[i].instances = ins
	}
	return nil
}
