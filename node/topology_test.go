package node

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
)

func TestPCIeLevelScores(t *testing.T) {
	want := map[PCIeLevel]int{PCIeUnknown: 0, PCIeSystem: 10, PCIeNode: 20, PCIeHostBridge: 30,
		PCIeMultipleSwitches: 40, PCIeSingleSwitch: 50, PCIeSameBoard: 60, PCIeLevel(99): 0}
	for l, s := range want {
		if l.Score() != s {
			t.Errorf("%v.Score() = %d, want %d", l, l.Score(), s)
		}
	}
	if got := (Link{PCIe: PCIeSingleSwitch, NVLinks: 2}).Score(); got != 250 {
		t.Errorf("PIX + NV2 scores %d, want 250", got)
	}
}

func square(n int, f func(i, j int) Link) [][]Link {
	m := make([][]Link, n)
	for i := range m {
		m[i] = make([]Link, n)
		for j := range m[i] {
			if i != j {
				m[i][j] = f(i, j)
			}
		}
	}
	return m
}

func TestNewTopology(t *testing.T) {
	links := square(3, func(i, j int) Link {
		if i+j == 1 {
			return Link{PCIe: PCIeSingleSwitch, NVLinks: 2}
		}
		return Link{PCIe: PCIeSystem}
	})
	topo, err := NewTopology(links)
	if err != nil {
		t.Fatal(err)
	}
	if topo.Len() != 3 || topo.Score(0, 1) != 250 || topo.Score(1, 0) != 250 || topo.Score(0, 2) != 10 {
		t.Fatalf("topology scores wrong: %v", topo.Matrix())
	}
	if got := topo.SetScore([]int{0, 1, 2}); got != 270 {
		t.Fatalf("SetScore = %d, want 270", got)
	}
	if topo.Link(0, 0) != (Link{}) || topo.Link(-1, 2) != (Link{}) || topo.Link(0, 3) != (Link{}) {
		t.Fatal("out-of-range or diagonal links must be zero")
	}
	// Matrix is a copy.
	m := topo.Matrix()
	m[0][1].NVLinks = 9
	if topo.Link(0, 1).NVLinks != 2 {
		t.Fatal("Matrix exposed the topology's storage")
	}

	bad := map[string][][]Link{
		"not square":   {{{}, {}}, {{}}},
		"asymmetric":   square(2, func(i, j int) Link { return Link{NVLinks: i} }),
		"negative":     square(2, func(i, j int) Link { return Link{NVLinks: -1} }),
		"unknown PCIe": square(2, func(i, j int) Link { return Link{PCIe: 42} }),
	}
	for name, links := range bad {
		t.Run(name, func(t *testing.T) {
			if _, err := NewTopology(links); !errors.Is(err, ErrInvalidTopology) {
				t.Fatalf("NewTopology = %v, want ErrInvalidTopology", err)
			}
		})
	}
}

func TestTopologyJSONRoundTrip(t *testing.T) {
	topo, err := NewTopology(square(4, func(i, j int) Link {
		return Link{PCIe: PCIeLevel(1 + (i+j)%6), NVLinks: (i * j) % 3}
	}))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(topo)
	if err != nil {
		t.Fatal(err)
	}
	var back Topology
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("unmarshal %s: %v", b, err)
	}
	for i := range 4 {
		if !slices.Equal(back.Matrix()[i], topo.Matrix()[i]) {
			t.Fatalf("round trip changed row %d: %s", i, b)
		}
	}
	for _, bad := range []string{`{"pcie":[["X","ZZZ"],["SYS","X"]],"nvlinks":[[0,0],[0,0]]}`, `{"pcie":[["X"]],"nvlinks":[]}`, `{"pcie":[["X","SYS"]],"nvlinks":[[0,0]]}`} {
		if err := json.Unmarshal([]byte(bad), &back); err == nil {
			t.Errorf("Unmarshal(%s) accepted a bad matrix", bad)
		}
	}
}

func TestCUDAVersion(t *testing.T) {
	tests := []struct {
		v    CUDAVersion
		text string
	}{{12020, "12.2"}, {11080, "11.8"}, {13000, "13.0"}, {10010, "10.1"}}
	for _, tt := range tests {
		if tt.v.String() != tt.text {
			t.Errorf("CUDAVersion(%d) = %q, want %q", int(tt.v), tt.v.String(), tt.text)
		}
		p, err := ParseCUDAVersion(tt.text)
		if err != nil || p != tt.v {
			t.Errorf("ParseCUDAVersion(%q) = %d, %v; want %d", tt.text, p, err, tt.v)
		}
		b, _ := json.Marshal(tt.v)
		var back CUDAVersion
		if err := json.Unmarshal(b, &back); err != nil || back != tt.v {
			t.Errorf("JSON round trip of %d via %s = %d, %v", tt.v, b, back, err)
		}
	}
	for _, bad := range []string{"", "x", "12.x", "12.100", "-1.0"} {
		if _, err := ParseCUDAVersion(bad); err == nil {
			t.Errorf("ParseCUDAVersion(%q) accepted", bad)
		}
	}
}
