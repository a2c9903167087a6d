// Command gpuiso-nomad-plugin is gpuiso's Nomad device plugin: an
// executable for the Nomad client's plugin_dir, which the agent starts and
// talks to over gRPC. It fingerprints the node's NVIDIA GPUs (and MIG
// devices) with their health, and reserves them for tasks with the device
// nodes of exactly their GPUs and the driver volume, or for gpuiso-runtime.
// See the nomad module's README for the client configuration.
package main

import (
	"log/slog"
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/gpuiso/gpuiso/nomad/deviceplugin"
)

func main() {
	// go-plugin forwards the plugin's stderr into the agent's log, and
	// reads hclog's JSON lines there with their level.
	hl := hclog.New(&hclog.LoggerOptions{Name: deviceplugin.Name, Output: os.Stderr, JSONFormat: true, Level: hclog.Info})
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{ReplaceAttr: hclogKeys}))
	p, err := deviceplugin.New(deviceplugin.WithLogger(log))
	if err != nil {
		hl.Error("start", "err", err)
		os.Exit(1)
	}
	deviceplugin.Serve(p, hl)
	_ = p.Close()
}

// hclogKeys names slog's level, message and time as hclog's JSON does, so
// that the agent shows the plugin's records at their level.
func hclogKeys(groups []string, a slog.Attr) slog.Attr {
	if len(groups) > 0 {
		return a
	}
	switch a.Key {
	case slog.LevelKey:
		a.Key = "@level"
		a.Value = slog.StringValue(map[string]string{"DEBUG": "debug", "INFO": "info", "WARN": "warn", "ERROR": "error"}[a.Value.String()])
	case slog.MessageKey:
		a.Key = "@message"
	case slog.TimeKey:
		a.Key = "@timestamp"
	}
	return a
}
