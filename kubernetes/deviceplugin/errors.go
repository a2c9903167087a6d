package deviceplugin

import "github.com/gpuiso/gpuiso/node"

var (
	// ErrUnknownDevice: a request names a device id the plugin does not serve.
	ErrUnknownDevice = node.Sentinel(node.ErrNotFound, "unknown device id")
	// ErrInvalidConfig: a Config field is missing or malformed.
	ErrInvalidConfig = node.Sentinel(node.ErrInvalid, "invalid device plugin configuration")
	// ErrHeld: a device to allocate is held by another owner (a DRA claim).
	ErrHeld = node.Sentinel(node.ErrUnavailable, "device held by another owner")
	// ErrSliceCount: a container asks for more than one concurrent slice
	// (StrategyMPS). The daemon holds each client process to one slice's
	// limits however many slices its container was given: two of one GPU
	// would be counted twice and give nothing more, and slices of two
	// GPUs would need two daemons' pipe directories at the one path a
	// container has.
	ErrSliceCount = node.Sentinel(node.ErrInvalid, "more than one concurrent slice in a container")
	// ErrRegister: the kubelet refused or did not answer a registration.
	ErrRegister = node.Sentinel(node.ErrUnavailable, "kubelet registration")
)
