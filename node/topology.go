package node

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// PCIeLevel is the PCIe relation of two GPUs: the closest point their paths to
// the CPU have in common. Greater is closer. The zero value means unknown
// (for example, a lost GPU).
type PCIeLevel uint8

// PCIe levels, from farthest to closest.
const (
	PCIeUnknown          PCIeLevel = iota
	PCIeSystem                     // across NUMA nodes / sockets (SMP interconnect): SYS
	PCIeNode                       // between host bridges of one NUMA node: NODE
	PCIeHostBridge                 // through one PCIe host bridge: PHB
	PCIeMultipleSwitches           // through several PCIe switches, no host bridge: PXB
	PCIeSingleSwitch               // through one PCIe switch: PIX
	PCIeSameBoard                  // on the same board (a dual-GPU card)
)

var pcieLevels = [...]struct{ abbrev, name string }{
	PCIeUnknown:          {"?", "unknown"},
	PCIeSystem:           {"SYS", "across NUMA nodes"},
	PCIeNode:             {"NODE", "same NUMA node"},
	PCIeHostBridge:       {"PHB", "host bridge"},
	PCIeMultipleSwitches: {"PXB", "multiple switches"},
	PCIeSingleSwitch:     {"PIX", "single switch"},
	PCIeSameBoard:        {"PSB", "same board"},
}

// Abbrev is the level as `nvidia-smi topo -m` writes it ("SYS", "NODE",
// "PHB", "PXB", "PIX"; "PSB" for two GPUs on one board).
func (l PCIeLevel) Abbrev() string {
	if int(l) < len(pcieLevels) {
		return pcieLevels[l].abbrev
	}
	return "?"
}

func (l PCIeLevel) String() string {
	if int(l) < len(pcieLevels) {
		return pcieLevels[l].name
	}
	return "PCIeLevel(" + strconv.Itoa(int(l)) + ")"
}

// Score is the level's weight in placement: 10 across NUMA nodes up to 60 on
// the same board, 0 when unknown.
func (l PCIeLevel) Score() int {
	if l > PCIeSameBoard {
		return 0
	}
	return int(l) * 10
}

// NVLinkScore is the placement weight of one NVLink between two GPUs.
const NVLinkScore = 100

// Link is how two GPUs are connected.
type Link struct {
	PCIe    PCIeLevel `json:"pcie"`
	NVLinks int       `json:"nvlinks,omitempty"`
}

// Score is the link's placement weight: its PCIe level's plus NVLinkScore per
// NVLink.
func (l Link) Score() int { return l.PCIe.Score() + NVLinkScore*l.NVLinks }

// Topology holds the link of every pair of a node's GPUs, indexed by their
// position in the inventory. It is read once, at discovery, and immutable:
// placement never calls NVML.
type Topology struct {
	n     int
	links []Link // n*n, symmetric; the diagonal is unused
}

// NewTopology builds a topology from a square, symmetric matrix of links.
func NewTopology(links [][]Link) (*Topology, error) {
	n := len(links)
	t := &Topology{n: n, links: make([]Link, n*n)}
	for i, row := range links {
		if len(row) != n {
			return nil, fmt.Errorf("topology row %d has %d links, want %d: %w", i, len(row), n, ErrInvalidTopology)
		}
		for j, l := range row {
			if i == j {
				continue
			}
			if l != links[j][i] {
				return nil, fmt.Errorf("topology link %d-%d is %+v but %d-%d is %+v: %w", i, j, l, j, i, links[j][i], ErrInvalidTopology)
			}
			if l.NVLinks < 0 || l.PCIe > PCIeSameBoard {
				return nil, fmt.Errorf("topology link %d-%d is %+v: %w", i, j, l, ErrInvalidTopology)
			}
			t.links[i*n+j] = l
		}
	}
	return t, nil
}

// Len is the number of GPUs.
func (t *Topology) Len() int {
	if t == nil {
		return 0
	}
	return t.n
}

// Link returns the link between GPUs i and j (the zero Link when i == j or
// either is out of range).
func (t *Topology) Link(i, j int) Link {
	if t == nil || i == j || i < 0 || j < 0 || i >= t.n || j >= t.n {
		return Link{}
	}
	return t.links[i*t.n+j]
}

// Score is the placement weight of the pair i, j.
func (t *Topology) Score(i, j int) int { return t.Link(i, j).Score() }

// SetScore is the placement weight of a set of GPUs: the sum of its pairs'.
func (t *Topology) SetScore(set []int) int {
	s := 0
	for a := range set {
		for b := a + 1; b < len(set); b++ {
			s += t.Score(set[a], set[b])
		}
	}
	return s
}

// Matrix returns a copy of the link matrix.
func (t *Topology) Matrix() [][]Link {
	m := make([][]Link, t.Len())
	for i := range m {
		m[i] = make([]Link, t.n)
		copy(m[i], t.links[i*t.n:(i+1)*t.n])
	}
	return m
}

type topologyJSON struct {
	PCIe    [][]string `json:"pcie"`
	NVLinks [][]int    `json:"nvlinks"`
}

// MarshalJSON writes the topology as two matrices: PCIe levels in
// `nvidia-smi topo -m` notation ("X" on the diagonal) and NVLink counts.
func (t *Topology) MarshalJSON() ([]byte, error) {
	v := topologyJSON{PCIe: make([][]string, t.Len()), NVLinks: make([][]int, t.Len())}
	for i := 0; i < t.Len(); i++ {
		v.PCIe[i] = make([]string, t.n)
		v.NVLinks[i] = make([]int, t.n)
		for j := 0; j < t.n; j++ {
			if i == j {
				v.PCIe[i][j] = "X"
				continue
			}
			l := t.Link(i, j)
			v.PCIe[i][j] = l.PCIe.Abbrev()
			v.NVLinks[i][j] = l.NVLinks
		}
	}
	return json.Marshal(v)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (t *Topology) UnmarshalJSON(b []byte) error {
	var v topologyJSON
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	if len(v.NVLinks) != len(v.PCIe) {
		return fmt.Errorf("topology has %d PCIe rows and %d NVLink rows: %w", len(v.PCIe), len(v.NVLinks), ErrInvalidTopology)
	}
	links := make([][]Link, len(v.PCIe))
	for i, row := range v.PCIe {
		if len(row) != len(v.PCIe) || len(v.NVLinks[i]) != len(v.PCIe) {
			return fmt.Errorf("topology row %d is not square: %w", i, ErrInvalidTopology)
		}
		links[i] = make([]Link, len(row))
		for j, abbrev := range row {
			if i == j {
				continue
			}
			level, ok := pcieLevelByAbbrev(abbrev)
			if !ok {
				return fmt.Errorf("topology link %d-%d: unknown PCIe level %q: %w", i, j, abbrev, ErrInvalidTopology)
			}
			links[i][j] = Link{PCIe: level, NVLinks: v.NVLinks[i][j]}
		}
	}
	nt, err := NewTopology(links)
	if err != nil {
		return err
	}
	*t = *nt
	return nil
}

func pcieLevelByAbbrev(s string) (PCIeLevel, bool) {
	for l, v := range pcieLevels {
		if v.abbrev == s {
			return PCIeLevel(l), true
		}
	}
	return 0, false
}
