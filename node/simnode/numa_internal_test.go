package simnode

import (
	"maps"
	"testing"
)

// TestNUMAFiles: the simulated node's NUMA nodes get the host's CPUs in
// contiguous runs (a node several's on a host with fewer CPUs than nodes),
// and has_memory lists those the host has memory on.
func TestNUMAFiles(t *testing.T) {
	n, err := New("dgx1-volta") // GPUs on NUMA nodes 0 and 1
	if err != nil {
		t.Fatal(err)
	}
	const cpu0, cpu1, mem = "sys/devices/system/node/node0/cpulist", "sys/devices/system/node/node1/cpulist", "sys/devices/system/node/has_memory"
	tests := []struct {
		name        string
		cpus, nodes []int
		want        map[string]string
	}{
		{"eight CPUs, memory on both", []int{0, 1, 2, 3, 4, 5, 6, 7}, []int{0, 1}, map[string]string{cpu0: "0-3\n", cpu1: "4-7\n", mem: "0,1\n"}},
		{"two CPUs, memory on node 0", []int{0, 1}, []int{0}, map[string]string{cpu0: "0\n", cpu1: "1\n", mem: "0\n"}},
		{"one CPU", []int{3}, []int{0}, map[string]string{cpu0: "3\n", cpu1: "3\n", mem: "0\n"}},
		{"no CPU known", nil, []int{0}, map[string]string{}},
	}
	for _, tt := range tests {
		if got := n.numaFiles(tt.cpus, tt.nodes); !maps.Equal(got, tt.want) {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
	if got := formatList([]int{0, 1, 2, 5, 7, 8}); got != "0-2,5,7-8" {
		t.Errorf("formatList = %q", got)
	}
	if got, ok := readList("/nonexistent"); ok || got != nil {
		t.Errorf("readList of nothing = %v, %v", got, ok)
	}
}
