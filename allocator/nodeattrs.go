package allocator

import (
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/attributes"
)

// NodeAttributes returns the node's GPUs as Mesos-style agent attributes
// (attributes.Mesos), with the allocator's health: gpus counts the GPUs
// the allocator holds healthy.
//
// Deprecated: use attributes.Mesos of the inventory with the allocator's
// Devices (what this does); this method will be removed in the next
// release.
func (a *Allocator) NodeAttributes() map[string]string {
	return attributes.Mesos(a.inventoryWithHealth())
}

// Labels returns the node's GPUs as Kubernetes-style node labels:
// attributes.Labels of the allocator's inventory.
//
// Deprecated: use attributes.Labels(a.Inventory()); this method will be
// removed in the next release.
func (a *Allocator) Labels() map[string]string {
	return attributes.Labels(a.inventoryWithHealth())
}

// LabelsOf is attributes.Labels.
//
// Deprecated: use attributes.Labels; LabelsOf will be removed in the next
// release.
func LabelsOf(inv *node.Inventory) map[string]string { return attributes.Labels(inv) }

// FormatMesosAttributes is attributes.FormatMesos.
//
// Deprecated: use attributes.FormatMesos; it will be removed in the next
// release.
func FormatMesosAttributes(attrs map[string]string) string { return attributes.FormatMesos(attrs) }

// LabelValue is attributes.LabelValue.
//
// Deprecated: use attributes.LabelValue; it will be removed in the next
// release.
func LabelValue(s string) string { return attributes.LabelValue(s) }

// inventoryWithHealth is a copy of the inventory whose devices carry the
// allocator's health; nil for an allocator without one.
func (a *Allocator) inventoryWithHealth() *node.Inventory {
	inv := a.Inventory()
	if inv == nil {
		return nil
	}
	inv.Devices = a.Devices()
	return inv
}
