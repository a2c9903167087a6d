package dra_test

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

// adminClaim is claim uid allocated devices with admin access, as the
// scheduler writes it for a request with adminAccess: true.
func adminClaim(uid string, devices ...string) *resourceapi.ResourceClaim {
	c := claim(uid, devices...)
	for i := range c.Status.Allocation.Devices.Results {
		c.Status.Allocation.Devices.Results[i].AdminAccess = ptr.To(true)
	}
	return c
}

// TestPrepareAdmin: a claim with admin access to a GPU another claim
// holds is prepared without taking it: its CDI spec has the GPU's nodes
// and names it, the allocator still holds it for its owner only, a
// restart writes the admin claim's spec back without holding anything,
// and unpreparing the admin claim gives back nothing. In a claim of both
// kinds only the devices without admin access are held.
func TestPrepareAdmin(t *testing.T) {
	e := newEnv(t, "dgx1-volta")
	d, a := e.driver(t)
	gpu0, gpu1 := e.inv.Devices[0], e.inv.Devices[1]
	owner := claim("owner", dra.DeviceName(gpu0))
	if _, err := d.Prepare(t.Context(), owner); err != nil {
		t.Fatal(err)
	}
	// Without admin access the GPU is refused.
	if _, err := d.Prepare(t.Context(), claim("plain", dra.DeviceName(gpu0))); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("a second claim of a held GPU: %v, want ErrDeviceUnavailable", err)
	}
	admin := adminClaim("admin", dra.DeviceName(gpu0))
	devs, err := d.Prepare(t.Context(), admin)
	if err != nil {
		t.Fatal(err)
	}
	checkAdminSpec(t, e, d, "admin", devs, gpu0.UUID)
	checkHolds(t, a, map[string][]string{"claim-owner": {gpu0.UUID}})

	// A restart: the CDI directory emptied (a reboot), the admin claim's
	// spec is written back, nothing more is held.
	os.RemoveAll(e.cdiDir)
	a.Close()
	d, a = e.driver(t)
	written, err := d.Restore(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !sameSet(written, []string{"admin", "owner"}) {
		t.Errorf("restored %v", written)
	}
	checkAdminSpec(t, e, d, "admin", devs, gpu0.UUID)
	checkHolds(t, a, map[string][]string{"claim-owner": {gpu0.UUID}})
	if _, err := d.Prepare(t.Context(), admin); err != nil {
		t.Fatalf("prepare again: %v", err)
	}

	if err := d.Unprepare(t.Context(), "admin"); err != nil {
		t.Fatal(err)
	}
	checkHolds(t, a, map[string][]string{"claim-owner": {gpu0.UUID}})

	// Both kinds in one claim: GPU 0 watched, GPU 1 held.
	mixed := claim("mixed", dra.DeviceName(gpu0), dra.DeviceName(gpu1))
	mixed.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
	devs, err = d.Prepare(t.Context(), mixed)
	if err != nil {
		t.Fatal(err)
	}
	checkAdminSpec(t, e, d, "mixed", devs, gpu0.UUID, gpu1.UUID)
	checkHolds(t, a, map[string][]string{"claim-owner": {gpu0.UUID}, "claim-mixed": {gpu1.UUID}})
	for _, uid := range []string{"mixed", "owner"} {
		if err := d.Unprepare(t.Context(), uid); err != nil {
			t.Fatal(err)
		}
	}
	checkHolds(t, a, map[string][]string{})

	// An admin claim of a free GPU holds nothing either: another claim
	// gets the GPU meanwhile.
	if _, err := d.Prepare(t.Context(), adminClaim("admin2", dra.DeviceName(gpu1))); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Prepare(t.Context(), claim("after", dra.DeviceName(gpu1))); err != nil {
		t.Fatalf("a claim of a GPU an admin claim watches: %v", err)
	}
	checkHolds(t, a, map[string][]string{"claim-after": {gpu1.UUID}})
}

// checkAdminSpec: the claim's CDI spec gives its container the GPUs'
// device nodes and names exactly them.
func checkAdminSpec(t *testing.T, e *env, d *dra.Driver, uid string, devs []kubeletplugin.Device, uuids ...string) {
	t.Helper()
	path, err := cdi.Writer{Dir: e.cdiDir}.AllocationPath(d.CDIKind(), "claim-"+uid)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := cdi.ValidateFile(path)
	if err != nil {
		t.Fatalf("claim %s's CDI spec: %v", uid, err)
	}
	var env string
	var nodes []string
	for _, kv := range spec.Devices[0].ContainerEdits.Env {
		if v, ok := strings.CutPrefix(kv, "NVIDIA_VISIBLE_DEVICES="); ok {
			env = v
		}
	}
	for _, n := range spec.Devices[0].ContainerEdits.DeviceNodes {
		nodes = append(nodes, n.Path)
	}
	if !sameSet(strings.Split(env, ","), uuids) {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %v", env, uuids)
	}
	for _, u := range uuids {
		for _, g := range e.inv.Devices {
			if g.UUID == u && !strings.Contains(strings.Join(nodes, " "), "/dev/nvidia"+strconv.Itoa(g.Minor)) {
				t.Errorf("spec's nodes %v lack GPU %s's", nodes, u)
			}
		}
	}
	if len(devs) == 0 || len(devs[0].CDIDeviceIDs) != 1 {
		t.Errorf("prepared devices %+v", devs)
	}
}

// checkHolds: the allocator holds exactly want, by owner.
func checkHolds(t *testing.T, a *allocator.Allocator, want map[string][]string) {
	t.Helper()
	got := map[string][]string{}
	for _, al := range a.Allocations() {
		for _, r := range al.Devices {
			got[al.Owner] = append(got[al.Owner], r.UUID)
		}
	}
	if len(got) != len(want) {
		t.Errorf("allocator holds %v, want %v", got, want)
		return
	}
	for o, u := range want {
		if !sameSet(got[o], u) {
			t.Errorf("allocator holds %v, want %v", got, want)
		}
	}
}
