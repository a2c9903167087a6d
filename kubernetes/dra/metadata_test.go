package dra_test

import (
	"os"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

// metadataDriver is e's driver with device metadata on.
func (e *env) metadataDriver(t *testing.T) *dra.Driver {
	t.Helper()
	for _, dir := range []string{e.allocDir, e.cdiDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	a, err := allocator.New(e.inv, allocator.WithStateDir(e.allocDir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	d, err := dra.New(e.inv, a, dra.Config{CDIDir: e.cdiDir, StateDir: e.stateDir, DeviceMetadata: true})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// attrs are dev's metadata attributes, failing the test without them.
func attrs(t *testing.T, dev kubeletplugin.Device) map[string]resourceapi.DeviceAttribute {
	t.Helper()
	if dev.Metadata == nil {
		t.Fatalf("device %s has no metadata", dev.DeviceName)
	}
	return dev.Metadata.Attributes
}

func wantString(t *testing.T, a map[string]resourceapi.DeviceAttribute, key, want string) {
	t.Helper()
	if v := a[key].StringValue; v == nil || *v != want {
		t.Errorf("%s = %v, want %q", key, v, want)
	}
}

func wantInt(t *testing.T, a map[string]resourceapi.DeviceAttribute, key string, want int64) {
	t.Helper()
	if v := a[key].IntValue; v == nil || *v != want {
		t.Errorf("%s = %v, want %d", key, v, want)
	}
}

// TestDeviceMetadata: with device metadata on, every prepared device
// describes itself as its slice does, with the device the claim holds
// (a whole GPU's, a MIG device's UUID) and what the claim was given
// (admin access); a repeated prepare (after a reboot, the kubelet's
// again) describes it the same; without the option, no device has any.
func TestDeviceMetadata(t *testing.T) {
	t.Run("gpu", func(t *testing.T) {
		e := newEnv(t, "dgx1-volta")
		d := e.metadataDriver(t)
		gpu := e.inv.Devices[3]
		for range 2 {
			devs, err := d.Prepare(t.Context(), claim("u1", dra.DeviceName(gpu)))
			if err != nil {
				t.Fatal(err)
			}
			a := attrs(t, devs[0])
			wantString(t, a, dra.AttrUUID, gpu.UUID)
			wantString(t, a, dra.AttrType, "gpu")
			wantString(t, a, string(deviceattribute.StandardDeviceAttributePCIBusID), gpu.BusID)
			wantInt(t, a, dra.AttrIndex, int64(gpu.Index))
			wantInt(t, a, dra.AttrNUMANode, int64(gpu.NUMANode))
			if _, ok := a[dra.AttrNVLinkClique]; !ok {
				t.Errorf("no NVLink clique: %v", a)
			}
			if _, ok := a[dra.AttrAdminAccess]; ok {
				t.Error("a plain claim has admin access")
			}
		}
	})
	t.Run("mig", func(t *testing.T) {
		e := newEnv(t, "hgx-h100-mig")
		d := e.metadataDriver(t)
		m := firstMIG(e.inv, "1g.10gb")
		devs, err := d.Prepare(t.Context(), claim("u1", dra.MIGDeviceName(m)))
		if err != nil {
			t.Fatal(err)
		}
		a := attrs(t, devs[0])
		wantString(t, a, dra.AttrUUID, m.UUID)
		wantString(t, a, dra.AttrMIGProfile, "1g.10gb")
	})
	t.Run("admin", func(t *testing.T) {
		e := newEnv(t, "dgx1-volta")
		d := e.metadataDriver(t)
		devs, err := d.Prepare(t.Context(), adminClaim("u1", dra.DeviceName(e.inv.Devices[0])))
		if err != nil {
			t.Fatal(err)
		}
		a := attrs(t, devs[0])
		if v := a[dra.AttrAdminAccess].BoolValue; v == nil || !*v {
			t.Errorf("adminAccess = %v, want true", v)
		}
		wantString(t, a, dra.AttrUUID, e.inv.Devices[0].UUID)
	})
	t.Run("off", func(t *testing.T) {
		e := newEnv(t, "dgx1-volta")
		d, _ := e.driver(t)
		devs, err := d.Prepare(t.Context(), claim("u1", dra.DeviceName(e.inv.Devices[0])))
		if err != nil {
			t.Fatal(err)
		}
		if devs[0].Metadata != nil {
			t.Errorf("metadata %+v without the option", devs[0].Metadata)
		}
	})
}

// TestShareMetadata: a share's metadata gives its memory, its compute
// percentage and the pipe directory of its MPS daemon.
func TestShareMetadata(t *testing.T) {
	e := newShareEnv(t)
	_, _, m := e.driver(t)
	a, err := allocator.New(e.inv, allocator.WithStateDir(e.allocDir), allocator.WithShared(e.gpu().UUID))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	d, err := dra.New(e.inv, a, dra.Config{CDIDir: e.cdiDir, StateDir: e.stateDir, MPS: m, DeviceMetadata: true,
		Slice: dra.SliceOptions{Shared: []string{e.gpu().UUID}}})
	if err != nil {
		t.Fatal(err)
	}
	c := shareClaim("s1", dra.ShareDeviceName(e.gpu()), 8*gib, `{"computePercent":25}`)
	devs, err := d.Prepare(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Unprepare(t.Context(), "s1") })
	at := attrs(t, devs[0])
	wantString(t, at, dra.AttrUUID, e.gpu().UUID)
	wantString(t, at, dra.AttrType, "share")
	wantInt(t, at, dra.AttrShareMemory, 8*gib)
	wantInt(t, at, dra.AttrShareComputePercent, 25)
	wantString(t, at, dra.AttrMPSPipeDirectory, isolator.MPSPipeDir)
	wantString(t, at, dra.AttrShareID, string(*devs[0].ShareID))
}
