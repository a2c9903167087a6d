package docker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/system"
	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// cdiDaemon is a daemon of a given API version and CDI spec directories
// that records the one container it is asked to create and refuses it.
type cdiDaemon struct {
	fakeDaemon
	api  string
	dirs []string

	mu      sync.Mutex
	created *client.ContainerCreateOptions
	asked   int
}

func (f *cdiDaemon) ServerVersion(context.Context, client.ServerVersionOptions) (client.ServerVersionResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	return client.ServerVersionResult{APIVersion: f.api}, nil
}

func (f *cdiDaemon) Info(context.Context, client.InfoOptions) (client.SystemInfoResult, error) {
	return client.SystemInfoResult{Info: system.Info{CDISpecDirs: f.dirs}}, nil
}

func (f *cdiDaemon) ContainerCreate(_ context.Context, opts client.ContainerCreateOptions) (client.ContainerCreateResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = &opts
	return client.ContainerCreateResult{}, errors.New("fake daemon creates nothing")
}

// TestCDIChoice: with WithCDI, a daemon of API 1.44 with CDI enabled gets
// the GPUs as one CDI device request naming them by UUID; an older daemon,
// or one with CDI off, gets device mappings. No daemon needed.
func TestCDIChoice(t *testing.T) {
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()))
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{"/etc/cdi", "/var/run/cdi"}
	for _, tt := range []struct {
		name string
		api  string
		dirs []string
		opts []docker.Option
		want string
	}{
		{"docker 25 with CDI", "1.44", dirs, []docker.Option{docker.WithCDI(cdi.DefaultKind)}, dockerconfig.InjectionCDI},
		{"docker 20.10", "1.41", dirs, []docker.Option{docker.WithCDI(cdi.DefaultKind)}, dockerconfig.InjectionDevices},
		{"CDI off", "1.47", nil, []docker.Option{docker.WithCDI(cdi.DefaultKind)}, dockerconfig.InjectionDevices},
		{"without WithCDI", "1.44", dirs, nil, dockerconfig.InjectionDevices},
	} {
		t.Run(tt.name, func(t *testing.T) {
			alloc, err := allocator.New(inv)
			if err != nil {
				t.Fatal(err)
			}
			fake := &cdiDaemon{fakeDaemon: fakeDaemon{images: map[string]*container.Config{"plain": nil}}, api: tt.api, dirs: tt.dirs}
			z, err := docker.New(fake, alloc, tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				if _, err := z.Launch(context.Background(), containerizer.Spec{ID: "a", Image: "plain", GPUs: allocator.Request{Devices: []string{"2", "5"}}}); err == nil {
					t.Fatal("Launch succeeded on a daemon that creates nothing")
				}
			}
			if tt.opts != nil && fake.asked != 1 {
				t.Errorf("daemon asked %d times, want once", fake.asked)
			}
			hc, labels := fake.created.HostConfig, fake.created.Config.Labels
			if labels[dockerconfig.LabelInjection] != tt.want {
				t.Fatalf("injection label %q, want %q", labels[dockerconfig.LabelInjection], tt.want)
			}
			var mapped []string
			for _, d := range hc.Devices {
				mapped = append(mapped, d.PathInContainer)
			}
			if tt.want == dockerconfig.InjectionDevices {
				gpus := []string{fmt.Sprintf("/dev/nvidia%d", inv.Devices[2].Minor), fmt.Sprintf("/dev/nvidia%d", inv.Devices[5].Minor)}
				if len(hc.DeviceRequests) != 0 || !slices.Contains(mapped, gpus[0]) || !slices.Contains(mapped, gpus[1]) {
					t.Errorf("device mappings %v, requests %+v; want %v mapped, no request", mapped, hc.DeviceRequests, gpus)
				}
				return
			}
			want := []string{cdi.DefaultKind + "=" + inv.Devices[2].UUID, cdi.DefaultKind + "=" + inv.Devices[5].UUID}
			if len(hc.DeviceRequests) != 1 || hc.DeviceRequests[0].Driver != "cdi" || !slices.Equal(hc.DeviceRequests[0].DeviceIDs, want) || len(mapped) != 0 {
				t.Errorf("device requests %+v, mappings %v; want one cdi request of %v and no mapping", hc.DeviceRequests, mapped, want)
			}
		})
	}
	if _, err := docker.New(&cdiDaemon{}, nil, docker.WithCDI("nvidia")); err == nil {
		t.Error("WithCDI took a bad kind")
	}
}

// TestCDIFallback: the provisioned daemon (Docker 20.10, API 1.41) takes no
// CDI requests: with WithCDI the containerizer maps the devices as before,
// says so in the container's labels, and the container gets its GPU.
func TestCDIFallback(t *testing.T) {
	r := newRig(t, "pcie8", false)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ver, err := r.cli.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := r.cli.Info(ctx, client.InfoOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if dockerconfig.CDISupported(ver.APIVersion, info.Info.CDISpecDirs) {
		t.Skipf("daemon %s (API %s) speaks CDI: no fallback to see", ver.Version, ver.APIVersion)
	}
	r.restart(t, docker.WithCDI(cdi.DefaultKind))
	img := r.image(t, nil, nil)
	minor := r.node.Minor(0)
	spec := containerizer.Spec{ID: "fallback", Image: img, GPUs: allocator.Request{Devices: []string{"0"}},
		Command: []string{"open", fmt.Sprintf("/dev/nvidia%d", minor), "/dev/nvidiactl"}}
	var out strings.Builder
	spec.Stdout = &out
	c, err := r.z.Launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer r.z.Destroy(ctx, spec.ID)
	if st, err := r.z.Wait(ctx, spec.ID); err != nil || st.Code != 0 {
		t.Fatalf("wait: %+v, %v", st, err)
	}
	insp, err := r.cli.ContainerInspect(ctx, c.RuntimeID, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := insp.Container.Config.Labels[dockerconfig.LabelInjection]; got != dockerconfig.InjectionDevices {
		t.Errorf("daemon %s (API %s): injection label %q, want %q", ver.Version, ver.APIVersion, got, dockerconfig.InjectionDevices)
	}
	if n := len(insp.Container.HostConfig.DeviceRequests); n != 0 {
		t.Errorf("%d device requests sent to a daemon without CDI", n)
	}
	got := lines(out.String())
	for p, r := range got {
		if r != "ENXIO" {
			t.Errorf("open %s = %s, want ENXIO (allowed)", p, r)
		}
	}
}
