package deviceplugin_test

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gpuiso/gpuiso/nomad/deviceplugin"
	"github.com/gpuiso/gpuiso/nomad/internal/proto/device"
)

// TestHealthEvents: an XID the driver reports and a GPU falling off the
// bus mark the GPU unhealthy in the stream, with the reason, while an
// application's XID leaves it healthy. The simulated node is the test's, so
// it serves the plugin in this process.
func TestHealthEvents(t *testing.T) {
	s := simulate(t, "dgx1-volta")
	p, err := deviceplugin.New(deviceplugin.WithSimulatedNode(s.sim))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	cfg := deviceplugin.DefaultConfig()
	cfg.Simulate, cfg.DevRoot, cfg.StateDir = s.name, s.devRoot, s.stateDir
	cfg.Env = deviceplugin.EnvRuntime
	if err := p.Configure(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	device.RegisterDevicePluginServer(srv, p)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	l := &loaded{device: device.NewDevicePluginClient(conn)}
	fps := l.fingerprints(t)
	fps.until(t, "every GPU healthy", func(fp *device.FingerprintResponse) bool {
		for _, d := range s.inv.Devices {
			if h, ok := health(fp, d.UUID); !ok || !h.GetHealthy() {
				return false
			}
		}
		return true
	})
	// An application's fault (XID 13) and then the driver's (XID 48) on
	// GPU 3: the stream's next change is GPU 3 unhealthy, naming XID 48.
	if err := s.sim.InjectXID(3, 13); err != nil {
		t.Fatal(err)
	}
	if err := s.sim.InjectXID(3, 48); err != nil {
		t.Fatal(err)
	}
	fp := fps.until(t, "GPU 3 unhealthy", func(fp *device.FingerprintResponse) bool {
		h, _ := health(fp, s.inv.Devices[3].UUID)
		return !h.GetHealthy()
	})
	if h, _ := health(fp, s.inv.Devices[3].UUID); !strings.Contains(h.GetHealthDescription(), "48") {
		t.Errorf("GPU 3: %v", h)
	}
	if err := s.sim.Lose(5); err != nil {
		t.Fatal(err)
	}
	fp = fps.until(t, "GPU 5 lost", func(fp *device.FingerprintResponse) bool {
		h, _ := health(fp, s.inv.Devices[5].UUID)
		return !h.GetHealthy()
	})
	for i, d := range s.inv.Devices {
		if h, _ := health(fp, d.UUID); h.GetHealthy() == (i == 3 || i == 5) {
			t.Errorf("GPU %d: %v", i, h)
		}
	}
	t.Logf("GPU 5: %s", func() string { h, _ := health(fp, s.inv.Devices[5].UUID); return h.GetHealthDescription() }())
}
