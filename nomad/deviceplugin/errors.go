package deviceplugin

import "github.com/gpuiso/gpuiso/node"

var (
	// ErrInvalidConfig: the plugin block holds an unknown key or a bad
	// value. The configuration in force stays as it was.
	ErrInvalidConfig = node.Sentinel(node.ErrInvalid, "invalid plugin configuration")
	// ErrAPIVersion: Nomad asks for a plugin API version the plugin does
	// not speak.
	ErrAPIVersion = node.Sentinel(node.ErrNotSupported, "unsupported plugin API version")
	// ErrNotConfigured: a device call came before a SetConfig that took.
	ErrNotConfigured = node.Sentinel(node.ErrUnavailable, "plugin not configured")
	// ErrDisabled: the plugin is configured with enabled = false.
	ErrDisabled = node.Sentinel(node.ErrUnavailable, "plugin disabled")
	// ErrUnknownDevice: Reserve names a device the last fingerprint did
	// not hold.
	ErrUnknownDevice = node.Sentinel(node.ErrNotFound, "unknown device")
	// ErrInvalidReserve: Reserve names no device, or one twice.
	ErrInvalidReserve = node.Sentinel(node.ErrInvalid, "invalid reservation")
	// ErrHeld: a device Reserve names is held by another user of gpuiso's
	// allocator state (gpurun, gpuiso-runtime, another orchestrator's
	// plugin) or is unhealthy.
	ErrHeld = node.Sentinel(node.ErrUnavailable, "device held or unhealthy")
)
