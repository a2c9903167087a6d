package deviceplugin

import "github.com/gpuiso/gpuiso/node"

var (
	// ErrUnknownDevice: a request names a device id the plugin does not serve.
	ErrUnknownDevice = node.Sentinel(node.ErrNotFound, "unknown device id")
	// ErrInvalidConfig: a Config field is missing or malformed.
	ErrInvalidConfig = node.Sentinel(node.ErrInvalid, "invalid device plugin configuration")
	// ErrHeld: a device to allocate is held by another owner (a DRA claim).
	ErrHeld = node.Sentinel(node.ErrUnavailable, "device held by another owner")
	// ErrRegister: the kubelet refused or did not answer a registration.
	ErrRegister = node.Sentinel(node.ErrUnavailable, "kubelet registration")
)
