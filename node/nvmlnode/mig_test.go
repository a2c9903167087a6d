package nvmlnode_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// checkMIG compares a discovered device's MIG side with the simulation's:
// the profile table on every MIG-capable GPU, and the MIG devices with
// their UUIDs, instance ids, profiles and capability nodes (minors from the
// dgx-a100 fixture's mig-minors, major 235 from its /proc/devices).
func checkMIG(t *testing.T, sim *simnode.Node, d node.Device) {
	t.Helper()
	spec := sim.Spec()
	if spec.GPU.MIGProfiles != "" && len(d.MIGProfiles) != 7 {
		t.Errorf("device %d: %d MIG profiles, want 7", d.Index, len(d.MIGProfiles))
	}
	want := sim.MIGDevices(d.Index)
	if len(d.MIGDevices) != len(want) {
		t.Fatalf("device %d: %d MIG devices, want %d", d.Index, len(d.MIGDevices), len(want))
	}
	for k, m := range d.MIGDevices {
		w := want[k]
		if m.UUID != w.UUID || m.GI != w.GI || m.CI != w.CI || m.Profile != w.Profile || m.ProfileID != w.ProfileID ||
			m.Placement != (node.MIGPlacement{Start: w.Start, Size: w.Size}) || m.Parent != d.Index || m.ParentUUID != d.UUID {
			t.Errorf("device %d MIG %d = %+v, want %+v", d.Index, k, m, w)
		}
		if !strings.HasPrefix(m.UUID, "MIG-") || !m.Health.Healthy || m.MemoryBytes == 0 || m.SMs == 0 {
			t.Errorf("device %d MIG %d = %+v", d.Index, k, m)
		}
		gi := 3 + (d.Minor*15+m.GI)*9
		if m.GIAccess.Major != 235 || m.GIAccess.Minor != uint32(gi) || m.CIAccess.Major != 235 || m.CIAccess.Minor != uint32(gi+1+m.CI) ||
			filepath.Base(m.GIAccess.Path) != fmt.Sprintf("nvidia-cap%d", gi) || filepath.Base(filepath.Dir(m.CIAccess.Path)) != node.NVIDIACapsDir {
			t.Errorf("device %d MIG %d caps = %v, %v", d.Index, k, m.GIAccess, m.CIAccess)
		}
	}
}

// TestDiscoverMIGStableUUIDs: the same layout has the same MIG UUIDs in
// every run, and different GPUs or nodes have different ones.
func TestDiscoverMIGStableUUIDs(t *testing.T) {
	a := discoverSim(t, newNode(t, "hgx-h100-mig").NVML())
	b := discoverSim(t, newNode(t, "hgx-h100-mig").NVML())
	seen := map[string]bool{}
	for i := range a.Devices {
		for k, m := range a.Devices[i].MIGDevices {
			if b.Devices[i].MIGDevices[k].UUID != m.UUID {
				t.Errorf("GPU %d MIG %d: UUID %s then %s", i, k, m.UUID, b.Devices[i].MIGDevices[k].UUID)
			}
			if seen[m.UUID] {
				t.Errorf("UUID %s twice", m.UUID)
			}
			seen[m.UUID] = true
		}
	}
	if len(seen) != 7+3+2+3 {
		t.Errorf("%d MIG devices, want 15", len(seen))
	}
	for _, d := range a.Devices[4:] {
		if d.MIG != node.MIGDisabled || len(d.MIGDevices) != 0 || len(d.MIGProfiles) != 7 {
			t.Errorf("GPU %d: MIG %s, %d devices, %d profiles; want disabled, 0, 7", d.Index, d.MIG, len(d.MIGDevices), len(d.MIGProfiles))
		}
	}
}

// TestDiscoverMIGProfilesH100 pins the profile table an H100 80GB reports.
func TestDiscoverMIGProfilesH100(t *testing.T) {
	inv := discoverSim(t, newNode(t, "hgx-h100").NVML())
	var got []string
	for _, p := range inv.Devices[0].MIGProfiles {
		got = append(got, fmt.Sprintf("%s id=%d n=%d sm=%d %dMiB %v", p.Name, p.ID, p.Count, p.SMs, p.MemoryBytes>>20, p.Placements))
	}
	want := []string{
		"1g.10gb id=19 n=7 sm=16 9984MiB [0:1 1:1 2:1 3:1 4:1 5:1 6:1]",
		"1g.10gb+me id=20 n=1 sm=16 9984MiB [0:1 1:1 2:1 3:1 4:1 5:1 6:1]",
		"1g.20gb id=15 n=4 sm=26 20096MiB [0:2 2:2 4:2 6:2]",
		"2g.20gb id=14 n=3 sm=32 20096MiB [0:2 2:2 4:2]",
		"3g.40gb id=9 n=2 sm=60 40448MiB [0:4 4:4]",
		"4g.40gb id=5 n=1 sm=64 40448MiB [0:4]",
		"7g.80gb id=0 n=1 sm=132 81152MiB [0:8]",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("profiles =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if inv.Devices[0].MIG != node.MIGDisabled || len(inv.Devices[0].MIGDevices) != 0 {
		t.Fatalf("MIG %s with %d devices on a GPU with MIG disabled", inv.Devices[0].MIG, len(inv.Devices[0].MIGDevices))
	}
}

// TestDiscoverMIGWithoutCapsTable: without the nvidia-caps minors the MIG
// devices are still found, without capability nodes, and one warning says
// why.
func TestDiscoverMIGWithoutCapsTable(t *testing.T) {
	dir := t.TempDir()
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(newNode(t, "dgx-a100-mig").NVML()),
		nvmlnode.WithDevRoot(dir), nvmlnode.WithProcRoot(dir), nvmlnode.WithSysRoot(dir))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(inv.Devices[0].MIGDevices); n != 7 {
		t.Fatalf("%d MIG devices on GPU 0, want 7", n)
	}
	if c := inv.Devices[0].MIGDevices[0].GIAccess; c.Path != "" {
		t.Fatalf("GI access node %v without a minors table", c)
	}
	n := 0
	for _, w := range inv.Warnings {
		if strings.Contains(w, "mig-minors") {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("warnings %q: want one about mig-minors", inv.Warnings)
	}
	if d := inv.Devices[3]; d.MIG != node.MIGEnabled || len(d.MIGDevices) != 0 {
		t.Fatalf("GPU 3: MIG %s with %d devices, want enabled with none", d.MIG, len(d.MIGDevices))
	}
}

// TestDiscoverMIGHost discovers a simulated host's capability nodes as
// root: the mig-minors table, the nvidia-caps major and the nodes under
// <dev>/nvidia-caps agree.
func TestDiscoverMIGHost(t *testing.T) {
	testenv.RequireRoot(t)
	sim := newNode(t, "hgx-h100-mig")
	h, err := sim.MakeHost(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Remove() })
	inv, err := nvmlnode.Discover(context.Background(), sim.DiscoverOptions(h)...)
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Warnings) != 0 {
		t.Fatalf("warnings %q", inv.Warnings)
	}
	for _, d := range inv.Devices {
		for _, m := range d.MIGDevices {
			for _, c := range []node.DeviceNode{m.GIAccess, m.CIAccess} {
				if c.Major != h.CapsMajor || !strings.HasPrefix(c.Path, filepath.Join(h.DevRoot, "nvidia-caps")+"/") {
					t.Errorf("GPU %d GI %d: cap node %v, want major %d under the host's dev root", d.Index, m.GI, c, h.CapsMajor)
				}
				if _, err := os.Stat(c.Path); err != nil {
					t.Error(err)
				}
			}
			b, err := os.ReadFile(filepath.Join(h.ProcRoot, "driver", "nvidia", "capabilities", fmt.Sprintf("gpu%d", d.Minor), "mig", fmt.Sprintf("gi%d", m.GI), fmt.Sprintf("ci%d", m.CI), "access"))
			if err != nil || !strings.Contains(string(b), fmt.Sprintf("DeviceFileMinor: %d\n", m.CIAccess.Minor)) || !strings.Contains(string(b), "DeviceFileMode: 292\n") {
				t.Errorf("CI access file: %q, %v", b, err)
			}
		}
	}
}

// TestMonitorMIGEvent: an XID the driver attributes to a GPU instance marks
// that MIG device unhealthy, not its parent or its siblings.
func TestMonitorMIGEvent(t *testing.T) {
	sim := newNode(t, "hgx-h100-mig")
	inv := discoverSim(t, sim.NVML())
	target := newMIGTarget(inv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan nvmlnode.HealthEvent, 4)
	done := make(chan error, 1)
	go func() {
		done <- nvmlnode.Monitor(ctx, sim.NVML(), target, func(e nvmlnode.HealthEvent) { events <- e })
	}()
	victim := inv.Devices[1].MIGDevices[1]
	deadline := time.After(10 * time.Second)
	for {
		// The monitor registers asynchronously: inject until it reports.
		if err := sim.InjectMIGXID(1, victim.GI, victim.CI, 48); err != nil {
			t.Fatal(err)
		}
		select {
		case e := <-events:
			if e.Err != nil {
				t.Fatal(e.Err)
			}
			if e.MIG == nil || e.MIG.UUID != victim.UUID || e.XID != 48 || e.Device.Index != 1 {
				t.Fatalf("event %+v, want MIG %s", e, victim.UUID)
			}
			for _, got := range target.marked() {
				if got != victim.UUID {
					t.Fatalf("marked %s, want only %s", got, victim.UUID)
				}
			}
			cancel()
			<-done
			return
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatal("no event")
		}
	}
}

// migTarget is a monitor target that records what it is told to mark.
type migTarget struct {
	inv *node.Inventory
	mu  sync.Mutex
	got []string
}

func newMIGTarget(inv *node.Inventory) *migTarget { return &migTarget{inv: inv} }

func (m *migTarget) Devices() []node.Device { return m.inv.Clone().Devices }

func (m *migTarget) MarkUnhealthy(_ context.Context, device, _ string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.got = append(m.got, device)
	return nil, nil
}

func (m *migTarget) marked() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.got)
}

// TestMonitorDynamicMIGEvent: an XID of a MIG device made after the
// monitor started (dynamic MIG) marks that MIG device unhealthy, not its
// parent.
func TestMonitorDynamicMIGEvent(t *testing.T) {
	sim := newNode(t, "hgx-h100-dynmig")
	inv := discoverSim(t, sim.NVML())
	a, err := allocator.New(inv, allocator.WithMIGManager(sim.MIGManager(nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan nvmlnode.HealthEvent, 4)
	done := make(chan error, 1)
	go func() {
		done <- nvmlnode.Monitor(ctx, sim.NVML(), a, func(e nvmlnode.HealthEvent) { events <- e })
	}()
	// The monitor registers asynchronously, reading the devices first:
	// an event of the user's MIG device on GPU 1 says it has.
	user := inv.Devices[1].MIGDevices[0]
	deadline := time.After(10 * time.Second)
	for started := false; !started; {
		if err := sim.InjectMIGXID(1, user.GI, user.CI, 48); err != nil {
			t.Fatal(err)
		}
		select {
		case e := <-events:
			started = e.MIG != nil && e.MIG.UUID == user.UUID
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatal("the monitor never started")
		}
	}
	for len(events) > 0 {
		<-events
	}
	al, err := a.AllocateMIGAt(ctx, "claim", allocator.MIGAt{Parent: sim.UUID(0), Profile: "1g.10gb", Start: 3})
	if err != nil {
		t.Fatal(err)
	}
	made := al.Devices[0]
	for {
		if err := sim.InjectMIGXID(0, made.MIG.GI, made.MIG.CI, 48); err != nil {
			t.Fatal(err)
		}
		select {
		case e := <-events:
			if e.Err != nil {
				t.Fatal(e.Err)
			}
			if e.MIG != nil && e.MIG.UUID == user.UUID {
				continue // a repeat of the first
			}
			if e.MIG == nil || e.MIG.UUID != made.UUID || e.Device.Index != 0 || !slices.Equal(e.Owners, []string{"claim"}) {
				t.Fatalf("event %+v (MIG %+v), want MIG %s", e, e.MIG, made.UUID)
			}
			if !a.Devices()[0].Health.Healthy {
				t.Fatal("the parent was marked unhealthy")
			}
			cancel()
			<-done
			return
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatal("no event")
		}
	}
}
