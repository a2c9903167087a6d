// Package deviceplugin is gpuiso's Nomad device plugin: the base and device
// services of Nomad's plugin protocol (see Serve for the go-plugin side,
// and the nomad module's internal/proto for the wire), over gpuiso's node
// model, allocator and isolation plan.
//
// # Configuration
//
// Nomad's loader asks PluginInfo (a device plugin of API v0.1.0, named
// gpuiso), reads ConfigSchema (Spec: every key optional, with a default),
// decodes the agent's plugin block through it and sends the value to
// SetConfig in go-cty's msgpack encoding. DecodeConfig reads it back and
// checks every key (Config); an unknown key, a value of the wrong type or
// out of range, or an API version other than v0.1.0 is refused with the
// key named, and the configuration in force stays as it was. A
// configuration that checks is opened whole (the node discovered, real or
// simulated; the allocator over gpuiso's state directory; the health
// monitor started) before it replaces the one in force.
//
// # Fingerprint and health
//
// Fingerprint streams one device group per GPU model, and one per model and
// MIG profile ("<model> MIG 1g.10gb"), as the mig key asks; devices by
// UUID, their PCI bus id as locality. A group's attributes are those its
// devices share: node's attributes under the names and units Nomad's NVIDIA
// plugin uses (memory in MiB, power in W, clocks in MHz, pci_bandwidth in
// MB/s, driver_version, display_state, persistence_mode), and
// compute_capability, architecture, cuda_version, numa_node, nvlink,
// mig_profile, sharing and isolation. Health is the allocator's: an XID or
// a lost GPU that nvmlnode.Monitor sees, or a device any process marks
// unhealthy in the same state directory (allocator.MarkUnhealthy), shows
// unhealthy with its reason; a MarkHealthy there makes it healthy again.
// The stream re-sends on every change, reading the state at least every
// fingerprint_period. Stats streams each device's memory used and total
// (the summary), utilisation, temperature and power, as NVML answers.
//
// # Reservations
//
// Reserve checks the ids against the last fingerprint. With env "devices"
// (the default) it holds each device in the allocator's state for
// DeviceOwner(id), so that gpurun, gpuiso-runtime or another orchestrator's
// plugin sharing the state directory never gets it, and returns the device
// nodes of exactly those devices with the control nodes (and a MIG
// device's capability nodes), the driver volume read-only at
// /usr/local/nvidia, and CUDA's environment, but no NVIDIA_VISIBLE_DEVICES,
// so that Nomad's docker driver keeps its default runtime. Nomad has no
// release call: every fingerprint_period the plugin reads the node's
// allocations through Nomad's HTTP API and gives back each device no
// allocation that has not ended uses; while the list cannot be read, it
// keeps every hold. With env "runtime" a reservation is
// NVIDIA_VISIBLE_DEVICES alone, for Nomad's docker driver with
// nvidia_runtime = "gpuiso": gpuiso-runtime then isolates the container and
// holds its GPUs for the container's life in the same state, and the
// plugin holds nothing.
//
// The plugin logs only to the logger it is given (WithLogger).
package deviceplugin
