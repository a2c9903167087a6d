package docker_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/node"
)

// TestNetwork: a container launched with the zero Spec.Network has a
// network namespace of its own holding only a loopback interface (as a
// native container's), never the daemon's default bridge; NetworkNone is
// the same, NetworkHost the host's interfaces.
func TestNetwork(t *testing.T) {
	r := newRig(t, "pcie8", false)
	img := r.image(t, nil, nil)
	for _, tt := range []struct {
		name    string
		network containerizer.Network
		onlyLo  bool
	}{
		{"zero", containerizer.NetworkPrivate, true},
		{"none", containerizer.NetworkNone, true},
		{"host", containerizer.NetworkHost, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			spec := containerizer.Spec{ID: "net-" + tt.name, Image: img, Network: tt.network, Command: []string{"ls", "/sys/class/net"}}
			_, out, errOut, code := r.run(t, spec)
			if code != 0 {
				t.Fatalf("ls /sys/class/net exited %d: %s%s", code, out, errOut)
			}
			ifaces := strings.Fields(out)
			slices.Sort(ifaces)
			if !slices.Contains(ifaces, "lo") {
				t.Fatalf("interfaces %q: no loopback", ifaces)
			}
			if only := len(ifaces) == 1; only != tt.onlyLo {
				t.Fatalf("interfaces %q, want only lo: %v", ifaces, tt.onlyLo)
			}
		})
	}
}

// TestMissingImage: an image the daemon does not have is refused with an
// error matching node.ErrNotFound (and no other kind), before anything is
// created or held.
func TestMissingImage(t *testing.T) {
	r := newRig(t, "pcie8", false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := r.z.Launch(ctx, containerizer.Spec{ID: "missing", Image: "gpuiso-no-such-image:" + r.ns[len(r.ns)-6:]})
	if !errors.Is(err, node.ErrNotFound) {
		t.Fatalf("Launch of a missing image = %v, want node.ErrNotFound", err)
	}
	for _, k := range []error{node.ErrNotSupported, node.ErrInvalid, node.ErrExists, node.ErrInsufficient, node.ErrUnavailable, node.ErrCorrupt} {
		if errors.Is(err, k) {
			t.Errorf("Launch of a missing image = %v, which also matches %v", err, k)
		}
	}
	if a := r.alloc.Allocations(); len(a) != 0 || len(r.ours(t)) != 0 {
		t.Fatalf("after the refusal: allocations %+v, containers %v", a, r.ours(t))
	}
}
