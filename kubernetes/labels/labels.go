// Package labels describes a node's GPUs as Kubernetes node labels, for
// schedulers that select nodes by label (the labels GPU feature discovery
// writes), and applies them to the Node object.
//
// Labels is a pure function of the node model: the labels of package node/attributes
// (nvidia.com/gpu.count, gpu.product, gpu.memory in MiB, gpu.family,
// gpu.compute.major/minor, cuda.driver.major/minor/rev,
// cuda.runtime.major/minor) plus MIG capability (nvidia.com/mig.capable)
// and the count of each MIG profile present (nvidia.com/mig-1g.10gb.count).
// Apply merges them into the Node and removes the labels of those
// families that no longer hold.
package labels

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/attributes"
)

// Labels returns the node labels of inv's GPUs: attributes.Labels and the
// MIG labels. It is a pure function of inv; a nil inv is refused
// (node.ErrInvalid).
func Labels(inv *node.Inventory) (map[string]string, error) {
	if inv == nil {
		return nil, fmt.Errorf("node labels: nil inventory: %w", node.ErrInvalid)
	}
	out := attributes.Labels(inv)
	capable := false
	profiles := map[string]int{}
	for _, d := range inv.Devices {
		if len(d.MIGProfiles) > 0 {
			capable = true
		}
		for _, m := range d.MIGDevices {
			profiles[m.Profile]++
		}
	}
	out["nvidia.com/mig.capable"] = strconv.FormatBool(capable)
	for p, n := range profiles {
		out["nvidia.com/mig-"+p+".count"] = strconv.Itoa(n)
	}
	return out, nil
}

// Owned reports whether a label belongs to the families Labels writes, so
// that Apply may remove it when it no longer holds.
func Owned(key string) bool {
	for _, p := range []string{"nvidia.com/gpu.", "nvidia.com/cuda.", "nvidia.com/mig."} {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return strings.HasPrefix(key, "nvidia.com/mig-") && strings.HasSuffix(key, ".count")
}

// Patch is the JSON merge patch that turns a node's labels current into
// current with want applied: want's labels set, owned labels not in want
// removed (null), every other label untouched. It is nil when nothing
// changes.
func Patch(current, want map[string]string) []byte {
	change := map[string]any{}
	for k, v := range want {
		if cur, ok := current[k]; !ok || cur != v {
			change[k] = v
		}
	}
	for k := range current {
		if _, ok := want[k]; !ok && Owned(k) {
			change[k] = nil
		}
	}
	if len(change) == 0 {
		return nil
	}
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": change}})
	return b
}

// Apply sets want on node nodeName (see Patch) and returns the keys it
// changed, sorted.
func Apply(ctx context.Context, c kubernetes.Interface, nodeName string, want map[string]string) ([]string, error) {
	n, err := c.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("label node %s: %w", nodeName, err)
	}
	patch := Patch(n.Labels, want)
	if patch == nil {
		return nil, nil
	}
	if _, err := c.CoreV1().Nodes().Patch(ctx, nodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return nil, fmt.Errorf("label node %s: %w", nodeName, err)
	}
	var p struct {
		Metadata struct {
			Labels map[string]any `json:"labels"`
		} `json:"metadata"`
	}
	_ = json.Unmarshal(patch, &p)
	keys := sortedKeys(p.Metadata.Labels)
	return keys, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range maps.Keys(m) {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
