package deviceplugin

import (
	"context"
	"errors"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/gpuiso/gpuiso/nomad/internal/proto/base"
	"github.com/gpuiso/gpuiso/nomad/internal/proto/device"
)

// Nomad's plugin handshake: the go-plugin protocol version and magic cookie
// its loader starts a plugin with, the same from Nomad 0.9 on.
const (
	ProtocolVersion  = 2
	MagicCookieKey   = "NOMAD_PLUGIN_MAGIC_COOKIE"
	MagicCookieValue = "e4327c2e01eabfd75a8a67adb114fb34a757d57eee7728d857a8cec6e91a7255"
)

// The plugin-set keys Nomad's loader dispenses.
const (
	PluginTypeBase   = "base"
	PluginTypeDevice = "device"
)

// Handshake is Nomad's plugin handshake.
func Handshake() plugin.HandshakeConfig {
	return plugin.HandshakeConfig{ProtocolVersion: ProtocolVersion, MagicCookieKey: MagicCookieKey, MagicCookieValue: MagicCookieValue}
}

// ErrServeOnly: the plugin set serves; it is no client.
var ErrServeOnly = errors.New("deviceplugin: the plugin set serves only")

// grpcPlugin registers one of the plugin's services with go-plugin's gRPC
// server.
type grpcPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	register func(*grpc.Server)
}

func (g *grpcPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	g.register(s)
	return nil
}

func (g *grpcPlugin) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, ErrServeOnly
}

// PluginSet is what go-plugin serves of p: its base service under "base",
// its device service under "device", as Nomad's loader dispenses them.
func PluginSet(p *Plugin) plugin.PluginSet {
	return plugin.PluginSet{
		PluginTypeBase:   &grpcPlugin{register: func(s *grpc.Server) { base.RegisterBasePluginServer(s, p) }},
		PluginTypeDevice: &grpcPlugin{register: func(s *grpc.Server) { device.RegisterDevicePluginServer(s, p) }},
	}
}

// Serve serves p to the Nomad agent that started this process, over gRPC
// with Nomad's handshake, until the agent ends it. Started by hand (without
// the handshake's cookie) it says it is a plugin and exits.
func Serve(p *Plugin, log hclog.Logger) {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake(),
		Plugins:         PluginSet(p),
		GRPCServer:      plugin.DefaultGRPCServer,
		Logger:          log,
	})
}
