package main

import (
	"context"
	"flag"
	"fmt"
	"sync/atomic"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

// registerExtendedResource registers --extended-resource-name: the
// extended resource that the DRA driver's DeviceClass of whole GPUs serves
// (its extendedResourceName, the chart's deviceClasses.extendedResourceName).
func (f *flags) registerExtendedResource(fs *flag.FlagSet) {
	fs.StringVar(&f.extendedResource, "extended-resource-name", "nvidia.com/gpu",
		"the extended resource the DRA driver's DeviceClass of whole GPUs serves (its extendedResourceName; \"\" when none): the device plugin may not serve the same name")
}

// resolveServing sets which sides serve the node once the command line is
// parsed (set: the flags given on it). With credentials and the DRA
// driver on, the device plugin is off unless --device-plugin asks for it:
// pods' resources.limits of nvidia.com/gpu are served by DRA through the
// DeviceClass's extendedResourceName, and Kubernetes does not support one
// extended resource served on a node by a device plugin and by DRA at
// once. That is refused: it returns the reason, or "".
func (f *flags) resolveServing(set map[string]bool) string {
	dra := f.dra && (f.kubeconfig != "" || f.deploy.inCluster)
	if dra && !set["device-plugin"] {
		f.devicePlugin = false
	}
	if dra && f.devicePlugin && f.extendedResource != "" && f.extendedResource == f.resourceName {
		return fmt.Sprintf("the device plugin (--resource-name %[1]s) and the DRA driver, whose DeviceClass serves %[1]s (--extended-resource-name), "+
			"would both serve %[1]s on this node: serve it from one side (--device-plugin=false, another --resource-name, or "+
			"--extended-resource-name= when no DeviceClass of the driver names it)", f.resourceName)
	}
	return ""
}

// republishing is the DRA driver as the kubelet plugin serves it: once
// claims are prepared or unprepared it publishes the node's slice again,
// since the order of its devices follows what is held
// (dra.PreferredOrder: the scheduler's first fit then gives a pod's
// extended resource NVLinked GPUs). The slice is written only when the
// order changed.
type republishing struct {
	*dra.Driver
	publish atomic.Pointer[func()]
}

func (r *republishing) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out, err := r.Driver.PrepareResourceClaims(ctx, claims)
	r.changed()
	return out, err
}

func (r *republishing) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out, err := r.Driver.UnprepareResourceClaims(ctx, claims)
	r.changed()
	return out, err
}

func (r *republishing) changed() {
	if p := r.publish.Load(); p != nil {
		(*p)()
	}
}
