package deviceplugin_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/nomad/internal/hclspecutil"
	"github.com/gpuiso/gpuiso/nomad/internal/proto/base"
	"github.com/gpuiso/gpuiso/nomad/internal/proto/device"
)

// This file stands in for Nomad's plugin loader: it starts the built
// program as Nomad does (go-plugin's client, Nomad's handshake written out
// here as Nomad has it, gRPC only), asks PluginInfo, checks the type and
// API version, reads ConfigSchema, encodes the plugin block through that
// schema as Nomad does, and calls SetConfig with the version it chose.

// The handshake as Nomad's loader has it (not the plugin's constants).
var nomadHandshake = plugin.HandshakeConfig{
	ProtocolVersion:  2,
	MagicCookieKey:   "NOMAD_PLUGIN_MAGIC_COOKIE",
	MagicCookieValue: "e4327c2e01eabfd75a8a67adb114fb34a757d57eee7728d857a8cec6e91a7255",
}

// connPlugin hands the loader the plugin's gRPC connection.
type connPlugin struct {
	plugin.NetRPCUnsupportedPlugin
}

func (connPlugin) GRPCServer(*plugin.GRPCBroker, *grpc.Server) error {
	return errors.New("client only")
}

func (connPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return c, nil
}

var (
	buildOnce sync.Once
	built     string
	buildErr  error
)

// program builds gpuiso-nomad-plugin once for the package's tests.
func program(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gpuiso-nomad-plugin-")
		if err != nil {
			buildErr = err
			return
		}
		built = filepath.Join(dir, "gpuiso-nomad-plugin")
		cmd := exec.Command("go", "build", "-o", built, "github.com/gpuiso/gpuiso/nomad/cmd/gpuiso-nomad-plugin")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build gpuiso-nomad-plugin: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built != "" {
		os.RemoveAll(filepath.Dir(built))
	}
	os.Exit(code)
}

// loaded is a plugin process as the loader holds it.
type loaded struct {
	client *plugin.Client
	base   base.BasePluginClient
	device device.DevicePluginClient
	spec   *base.ConfigSchemaResponse
	info   *base.PluginInfoResponse
}

// launch starts the plugin and dispenses its two services, as Nomad's
// loader does; the process ends with the test.
func launch(t *testing.T) *loaded {
	t.Helper()
	w := &testWriter{t: t}
	t.Cleanup(w.stop)
	c := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  nomadHandshake,
		Plugins:          map[string]plugin.Plugin{"base": connPlugin{}, "device": connPlugin{}},
		Cmd:              exec.Command(program(t)),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           hclog.New(&hclog.LoggerOptions{Output: w, Level: hclog.Info}),
	})
	t.Cleanup(c.Kill)
	rpc, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	b, err := rpc.Dispense("base")
	if err != nil {
		t.Fatal(err)
	}
	d, err := rpc.Dispense("device")
	if err != nil {
		t.Fatal(err)
	}
	return &loaded{client: c, base: base.NewBasePluginClient(b.(*grpc.ClientConn)), device: device.NewDevicePluginClient(d.(*grpc.ClientConn))}
}

// load launches the plugin and configures it with config (the plugin
// block as the agent's parser reads it), as Nomad's loader does.
func load(t *testing.T, config map[string]any) *loaded {
	t.Helper()
	l := launch(t)
	if err := l.configure(config, ""); err != nil {
		t.Fatal(err)
	}
	return l
}

// configure is the loader's part: info, version negotiation, schema,
// encoding, SetConfig. version overrides the API version sent.
func (l *loaded) configure(config map[string]any, version string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info, err := l.base.PluginInfo(ctx, &base.PluginInfoRequest{})
	if err != nil {
		return err
	}
	if info.GetType() != base.PluginType_DEVICE {
		return fmt.Errorf("plugin type %v", info.GetType())
	}
	l.info = info
	if version == "" {
		for _, v := range info.GetPluginApiVersions() {
			if v == "v0.1.0" {
				version = v
			}
		}
		if version == "" {
			return fmt.Errorf("no API version in common: %v", info.GetPluginApiVersions())
		}
	}
	schema, err := l.base.ConfigSchema(ctx, &base.ConfigSchemaRequest{})
	if err != nil {
		return err
	}
	l.spec = schema
	data, err := hclspecutil.Encode(schema.GetSpec(), config)
	if err != nil {
		return fmt.Errorf("nomad: %w", err)
	}
	_, err = l.base.SetConfig(ctx, &base.SetConfigRequest{MsgpackConfig: data, PluginApiVersion: version, NomadConfig: &base.NomadConfig{}})
	return err
}

// fingerprints opens the fingerprint stream.
func (l *loaded) fingerprints(t *testing.T) *stream[*device.FingerprintResponse] {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := l.device.Fingerprint(ctx, &device.FingerprintRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return &stream[*device.FingerprintResponse]{recv: s.Recv}
}

// stream reads a server stream until a message satisfies a condition.
type stream[T any] struct {
	recv func() (T, error)
}

// until returns the first message for which ok holds, failing t when the
// stream ends or a minute passes first.
func (s *stream[T]) until(t *testing.T, what string, ok func(T) bool) T {
	t.Helper()
	type got struct {
		m   T
		err error
	}
	deadline := time.After(time.Minute)
	for {
		ch := make(chan got, 1)
		go func() {
			m, err := s.recv()
			ch <- got{m, err}
		}()
		select {
		case g := <-ch:
			if g.err != nil {
				t.Fatalf("waiting for %s: %v", what, g.err)
			}
			if ok(g.m) {
				return g.m
			}
		case <-deadline:
			t.Fatalf("no %s within a minute", what)
		}
	}
}

// simulated is a simulated node's host tree the plugin and the test share,
// and a state directory.
type simulated struct {
	name     string
	devRoot  string
	stateDir string
	sim      *simnode.Node
	host     *simnode.Host
	inv      *node.Inventory
}

// simulate makes the host tree of the shipped node name (root needed).
func simulate(t *testing.T, name string) *simulated {
	t.Helper()
	testenv.RequireRoot(t)
	sim, err := simnode.New(name)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := &simulated{name: name, devRoot: filepath.Join(dir, "node"), stateDir: filepath.Join(dir, "state"), sim: sim}
	ctx := context.Background()
	if s.host, err = sim.OpenHost(ctx, s.devRoot); err != nil {
		t.Fatal(err)
	}
	if s.inv, err = nvmlnode.Discover(ctx, sim.DiscoverOptions(s.host)...); err != nil {
		t.Fatal(err)
	}
	return s
}

// config is the plugin block for the node, with more keys from extra.
func (s *simulated) config(extra map[string]any) map[string]any {
	c := map[string]any{"simulate": s.name, "dev_root": s.devRoot, "state_dir": s.stateDir, "fingerprint_period": "100ms"}
	for k, v := range extra {
		c[k] = v
	}
	return c
}

// allocator opens the state directory as another process of the node
// (gpurun, gpuiso-runtime) does.
func (s *simulated) allocator(t *testing.T) *allocator.Allocator {
	t.Helper()
	a, err := allocator.New(s.inv, allocator.WithStateDir(s.stateDir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// testWriter logs the plugin's output through t until the test ends.
type testWriter struct {
	t       *testing.T
	mu      sync.Mutex
	stopped bool
}

func (w *testWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.t.Logf("%s", b)
	}
	return len(b), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
}

var _ io.Writer = (*testWriter)(nil)
