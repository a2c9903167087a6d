package simnode

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
)

//go:embed testdata/topologies/*.json
var shipped embed.FS

const shippedDir = "testdata/topologies"

// Spec describes a simulated node: its GPU model and, per GPU, where it sits
// on the PCIe tree, plus the NVLinks between GPUs. It is what the shipped
// topology files hold.
type Spec struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// GPU describes the model every GPU of the node has.
	GPU Model `json:"gpu"`
	// GPUs are the node's GPUs in NVML index order.
	GPUs []GPU `json:"gpus"`
	// NVLinks are direct links: [a, b, count] for GPUs a and b.
	NVLinks [][3]int `json:"nvlinks,omitempty"`
	// NVSwitchLinks, when non-zero, is the number of NVLinks each GPU has to
	// the node's NVSwitches, which connect every GPU to every other.
	NVSwitchLinks int `json:"nvswitchLinks,omitempty"`
}

// Model is what NVML reports of a GPU model.
type Model struct {
	Model             string `json:"model"`
	Brand             string `json:"brand"`
	Architecture      string `json:"architecture"`
	ComputeCapability string `json:"computeCapability"`
	MemoryMiB         int    `json:"memoryMiB"`
	BAR1MiB           int    `json:"bar1MiB,omitempty"`
	PowerW            int    `json:"powerW,omitempty"`
	CoresClockMHz     int    `json:"coresClockMHz,omitempty"`
	MemoryClockMHz    int    `json:"memoryClockMHz,omitempty"`
	PCIeGeneration    int    `json:"pcieGeneration,omitempty"`
	PCIeWidth         int    `json:"pcieWidth,omitempty"`
	PersistenceMode   bool   `json:"persistenceMode,omitempty"`
	DisplayMode       bool   `json:"displayMode,omitempty"`
	MIGCapable        bool   `json:"migCapable,omitempty"`
	// MIGProfiles names the model's MIG profile table (see
	// MIGProfileTables), for a MIG-capable model.
	MIGProfiles string `json:"migProfiles,omitempty"`
}

// GPU is one GPU's place on the node.
type GPU struct {
	BusID string `json:"busId"`
	// Minor is the device minor number; nil means the GPU's index.
	Minor *int `json:"minor,omitempty"`
	// NUMANode is the socket's NUMA node the GPU hangs off.
	NUMANode int `json:"numaNode"`
	// HostBridge identifies the PCIe host bridge above the GPU.
	HostBridge int `json:"hostBridge"`
	// Switches are the PCIe switches between the host bridge and the GPU,
	// outermost first. GPUs with the same last switch are on one switch.
	Switches []int `json:"switches,omitempty"`
	// Board, when set, groups GPUs on one board (a dual-GPU card).
	Board *int `json:"board,omitempty"`
	// MIG, when set, enables MIG on the GPU and splits it as it says.
	MIG *MIGLayout `json:"mig,omitempty"`
}

// Names lists the shipped topologies.
func Names() []string {
	entries, _ := fs.ReadDir(shipped, shippedDir)
	var names []string
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".json"))
	}
	slices.Sort(names)
	return names
}

// Load returns the shipped topology called name.
func Load(name string) (*Spec, error) {
	if !slices.Contains(Names(), name) {
		return nil, &UnknownTopologyError{Name: name, Known: Names()}
	}
	b, err := shipped.ReadFile(path.Join(shippedDir, name+".json"))
	if err != nil {
		return nil, err
	}
	return ParseSpec(bytes.NewReader(b))
}

// ParseSpec reads and validates a topology description.
func ParseSpec(r io.Reader) (*Spec, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var s Spec
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("topology: %w: %w", ErrInvalidSpec, err)
	}
	if err := s.validate(); err != nil {
		return nil, fmt.Errorf("topology %q: %w", s.Name, err)
	}
	return &s, nil
}

func (s *Spec) validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidSpec, fmt.Sprintf(format, args...)))
	}
	if s.Name == "" {
		bad("no name")
	}
	if len(s.GPUs) == 0 {
		bad("no GPUs")
	}
	if s.GPU.Model == "" || s.GPU.MemoryMiB <= 0 {
		bad("GPU model needs a name and memory")
	}
	if _, err := node.ParseCUDAVersion(s.GPU.ComputeCapability); err != nil {
		bad("compute capability %q", s.GPU.ComputeCapability)
	}
	busIDs, minors := map[string]bool{}, map[int]bool{}
	for i, g := range s.GPUs {
		id, err := node.NormalizeBusID(g.BusID)
		if err != nil || id != g.BusID {
			bad("GPU %d: bus id %q is not normalised (want %q)", i, g.BusID, id)
		}
		if busIDs[id] {
			bad("GPU %d: duplicate bus id %s", i, id)
		}
		busIDs[id] = true
		m := s.minor(i)
		if m < 0 || m >= nvmlnode.ModesetMinor || minors[m] {
			bad("GPU %d: minor %d is out of range or taken", i, m)
		}
		minors[m] = true
	}
	for _, l := range s.NVLinks {
		a, b, n := l[0], l[1], l[2]
		if a < 0 || b < 0 || a >= len(s.GPUs) || b >= len(s.GPUs) || a == b || n <= 0 {
			bad("NVLink %v: want [a, b, count] with distinct GPUs and count > 0", l)
		}
	}
	if s.NVSwitchLinks < 0 {
		bad("negative NVSwitch links")
	}
	if s.GPU.MIGProfiles != "" && (!s.GPU.MIGCapable || migProfileTables[s.GPU.MIGProfiles] == nil) {
		bad("MIG profile table %q needs a MIG-capable model and one of %v", s.GPU.MIGProfiles, MIGProfileTables())
	}
	for i, g := range s.GPUs {
		if g.MIG == nil {
			continue
		}
		table := s.profiles()
		if table == nil {
			errs = append(errs, fmt.Errorf("%w: GPU %d: MIG layout on a model without a MIG profile table: %w", ErrInvalidSpec, i, ErrMIGLayout))
			continue
		}
		if _, err := placeAll(table, g.MIG.Instances); err != nil {
			errs = append(errs, fmt.Errorf("%w: GPU %d: %w", ErrInvalidSpec, i, err))
		}
	}
	return errors.Join(errs...)
}

func (s *Spec) minor(i int) int {
	if s.GPUs[i].Minor != nil {
		return *s.GPUs[i].Minor
	}
	return i
}

// pcie is the PCIe relation of GPUs a and b, from their places on the tree.
func (s *Spec) pcie(a, b int) node.PCIeLevel {
	ga, gb := s.GPUs[a], s.GPUs[b]
	switch {
	case ga.Board != nil && gb.Board != nil && *ga.Board == *gb.Board:
		return node.PCIeSameBoard
	case len(ga.Switches) > 0 && len(gb.Switches) > 0 && ga.Switches[len(ga.Switches)-1] == gb.Switches[len(gb.Switches)-1]:
		return node.PCIeSingleSwitch
	case slices.ContainsFunc(ga.Switches, func(sw int) bool { return slices.Contains(gb.Switches, sw) }):
		return node.PCIeMultipleSwitches
	case ga.HostBridge == gb.HostBridge:
		return node.PCIeHostBridge
	case ga.NUMANode == gb.NUMANode:
		return node.PCIeNode
	}
	return node.PCIeSystem
}

// Topology is the link matrix the spec describes: what discovery of a
// simulated node must find.
func (s *Spec) Topology() (*node.Topology, error) {
	n := len(s.GPUs)
	links := make([][]node.Link, n)
	for i := range links {
		links[i] = make([]node.Link, n)
		for j := range links[i] {
			if i != j {
				links[i][j] = node.Link{PCIe: s.pcie(i, j), NVLinks: s.nvlinks(i, j)}
			}
		}
	}
	return node.NewTopology(links)
}

func (s *Spec) nvlinks(a, b int) int {
	n := 0
	for _, l := range s.NVLinks {
		if (l[0] == a && l[1] == b) || (l[0] == b && l[1] == a) {
			n += l[2]
		}
	}
	if s.NVSwitchLinks > 0 {
		n += s.NVSwitchLinks
	}
	return n
}

// clone returns a deep copy.
func (s *Spec) clone() *Spec {
	c := *s
	c.GPUs = make([]GPU, len(s.GPUs))
	for i, g := range s.GPUs {
		g.Switches = slices.Clone(g.Switches)
		if g.MIG != nil {
			l := MIGLayout{Instances: slices.Clone(g.MIG.Instances)}
			g.MIG = &l
		}
		c.GPUs[i] = g
	}
	c.NVLinks = slices.Clone(s.NVLinks)
	return &c
}
