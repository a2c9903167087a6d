package simnode

import (
	"os"
	"runtime"
	"strconv"
	"strings"
)

// hostCPUs are the host's online CPUs (/sys/devices/system/cpu/online),
// or 0 to runtime.NumCPU()-1 when it does not say.
func hostCPUs() []int {
	if list, ok := readList("/sys/devices/system/cpu/online"); ok && len(list) > 0 {
		return list
	}
	out := make([]int, runtime.NumCPU())
	for i := range out {
		out[i] = i
	}
	return out
}

// hostMemoryNodes are the host's NUMA nodes with memory
// (/sys/devices/system/node/has_memory), or node 0 when it does not say.
func hostMemoryNodes() []int {
	if list, ok := readList("/sys/devices/system/node/has_memory"); ok {
		return list
	}
	return []int{0}
}

// readList reads a file in the kernel's list format ("0-3,8").
func readList(p string) ([]int, bool) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, false
	}
	var out []int
	for _, f := range strings.Split(strings.TrimSpace(string(b)), ",") {
		if f == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(f, "-")
		a, err1 := strconv.Atoi(lo)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || a < 0 || b < a || b-a > 1<<16 {
			return nil, false
		}
		for i := a; i <= b; i++ {
			out = append(out, i)
		}
	}
	return out, true
}

// formatList writes sorted numbers in the kernel's list format.
func formatList(list []int) string {
	var parts []string
	for i := 0; i < len(list); {
		j := i
		for j+1 < len(list) && list[j+1] == list[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, strconv.Itoa(list[i])+"-"+strconv.Itoa(list[j]))
		} else {
			parts = append(parts, strconv.Itoa(list[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
