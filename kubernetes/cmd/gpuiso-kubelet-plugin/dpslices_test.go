package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/mps"
)

// TestRunDeviceSlices: the program on a simulated node with
// --device-plugin-sharing=mps serves GPU 0 as two concurrent slices of
// nvidia.com/gpu.shared; two containers given one each get the pipe
// directory of one MPS daemon, recorded under the state directory's
// mps-deviceplugin, which serves GPU 0 in two slices.
func TestRunDeviceSlices(t *testing.T) {
	testenv.RequireSimulatedMPS(t)
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
	mpsDir := filepath.Join(dir, "state", deviceSlicesMPSDir)
	t.Cleanup(func() {
		if m, err := mps.New(mpsDir); err == nil {
			m.Sweep(context.Background(), nil)
			m.Close()
		}
	})

	args := []string{"--simulate", "dgx1-volta", "--sim-root", filepath.Join(dir, "host"), "--device-plugin-dir", dp,
		"--state-dir", filepath.Join(dir, "state"), "--cdi-dir", filepath.Join(dir, "cdi"), "--node-name", "n1",
		"--shared-gpus", "0", "--time-slices", "2", "--device-plugin-sharing", "mps", "--mps-plain-dirs",
		"--pod-resources-socket", filepath.Join(dir, "no-kubelet.sock")}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var logs syncLog
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, &logs) }()
	var endpoint string
	for endpoint == "" {
		select {
		case r := <-k.reqs:
			if r.ResourceName == "nvidia.com/gpu.shared" {
				endpoint = r.Endpoint
			}
		case code := <-done:
			t.Fatalf("exited %d: %s", code, logs.String())
		case <-time.After(30 * time.Second):
			t.Fatalf("no registration of nvidia.com/gpu.shared: %s", logs.String())
		}
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(dp, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pluginapi.NewDevicePluginClient(conn)
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Devices) != 2 {
		t.Fatalf("replicas %v, want two", list.Devices)
	}
	var pipes []string
	for _, d := range list.Devices {
		resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{d.ID}}}})
		if err != nil {
			t.Fatalf("allocate %s: %v\n%s", d.ID, err, logs.String())
		}
		cr := resp.ContainerResponses[0]
		for _, m := range cr.Mounts {
			if m.ContainerPath == isolator.MPSPipeDir {
				pipes = append(pipes, m.HostPath)
			}
		}
		if cr.Envs[isolator.EnvMPSPipeDir] != isolator.MPSPipeDir {
			t.Errorf("%s: environment %v", d.ID, cr.Envs)
		}
	}
	ds, err := mps.Daemons(ctx, mpsDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 || !ds[0].Alive || ds[0].Slices != 2 || len(pipes) != 2 || pipes[0] != ds[0].PipeDir || pipes[1] != ds[0].PipeDir {
		t.Errorf("daemons %+v, pipe directories given %v: want one daemon of two slices, both its", ds, pipes)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit %d: %s", code, logs.String())
	}
}

// syncLog is a log buffer written by the program and read by the test.
type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncLog) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}
