package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cdi"
)

// TestFlags: bad command lines exit 2 with a reason; defaults are the
// kubelet's paths.
func TestFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{name: "simulate without dev root", args: []string{"--simulate", "dgx1-volta"}, code: 2, want: "--sim-root"},
		{name: "nothing to serve", args: []string{"--device-plugin=false", "--dra=false"}, code: 2, want: "nothing to serve"},
		{name: "unknown flag", args: []string{"--nope"}, code: 2, want: "nope"},
		{name: "stray argument", args: []string{"x"}, code: 2, want: "unexpected"},
		{name: "empty node name", args: []string{"--node-name", ""}, code: 2, want: "--node-name"},
		{name: "help", args: []string{"--help"}, code: 0, want: "kubelet-registry-dir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			_, code, done := parse(tt.args, &out)
			if !done || code != tt.code || !strings.Contains(out.String(), tt.want) {
				t.Errorf("parse = %d, %v, %q; want %d and %q", code, done, out.String(), tt.code, tt.want)
			}
		})
	}
	f, _, done := parse(nil, &bytes.Buffer{})
	if done {
		t.Fatal("no arguments refused")
	}
	for got, want := range map[string]string{
		f.pluginsDir: "/var/lib/kubelet/plugins", f.registryDir: "/var/lib/kubelet/plugins_registry",
		f.devicePluginDir: "/var/lib/kubelet/device-plugins", f.driverName: "gpu.gpuiso.io",
		f.resourceName: "nvidia.com/gpu", f.cdiDir: "/var/run/cdi",
	} {
		if got != want {
			t.Errorf("default %q, want %q", got, want)
		}
	}
}

type kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	reqs chan *pluginapi.RegisterRequest
}

func (k *kubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.reqs <- r
	return &pluginapi.Empty{}, nil
}

// TestRunSimulated: the program on a simulated node writes the node's CDI
// spec and registers its device plugin; stopped and started again on the
// same directories (its own restart), it reuses the host tree and registers
// again; stopping it removes its socket.
func TestRunSimulated(t *testing.T) {
	testenv.RequireRoot(t)
	dir, err := os.MkdirTemp("", "gkp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	dp := filepath.Join(dir, "dp")
	if err := os.MkdirAll(dp, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(dp, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{reqs: make(chan *pluginapi.RegisterRequest, 8)}
	s := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(s, k)
	go s.Serve(l)
	t.Cleanup(s.Stop)

	args := []string{"--simulate", "dgx1-volta", "--sim-root", filepath.Join(dir, "host"), "--device-plugin-dir", dp,
		"--state-dir", filepath.Join(dir, "state"), "--cdi-dir", filepath.Join(dir, "cdi"), "--node-name", "n1"}
	for round := range 2 {
		ctx, cancel := context.WithCancel(t.Context())
		var logs bytes.Buffer
		done := make(chan int, 1)
		go func() { done <- run(ctx, args, &logs) }()
		select {
		case r := <-k.reqs:
			if r.ResourceName != "nvidia.com/gpu" {
				t.Errorf("round %d: registered %q", round, r.ResourceName)
			}
		case code := <-done:
			t.Fatalf("round %d: exited %d: %s", round, code, logs.String())
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: no registration: %s", round, logs.String())
		}
		names, err := cdi.List(filepath.Join(dir, "cdi"))
		if err != nil || len(names) < 16 {
			t.Errorf("round %d: CDI names %v, %v", round, names, err)
		}
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("round %d: exit %d: %s", round, code, logs.String())
		}
		entries, _ := os.ReadDir(dp)
		for _, e := range entries {
			if e.Name() != "kubelet.sock" {
				t.Errorf("round %d: %s left in the device-plugin directory", round, e.Name())
			}
		}
	}
}
