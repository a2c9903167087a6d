package node

// Usage is what a container uses of its GPUs, as the driver reports it
// (nvmlnode.ReadUsage fills it). It lives in the node model, which needs
// no cgo, so that packages that only pass it on (containerizer) build
// without the driver's bindings.
type Usage struct {
	GPUs []GPUUsage `json:"gpus"`
}

// GPUUsage is one GPU's share used by the container's processes.
type GPUUsage struct {
	UUID string `json:"uuid"`
	// Processes are the container's processes the driver lists on the GPU.
	Processes []int `json:"processes,omitempty"`
	// MemoryBytes is the GPU memory those processes hold.
	MemoryBytes uint64 `json:"memoryBytes"`
	// SMUtilization and MemoryUtilization are the processes' busiest recent
	// sample, in percent; nil where the driver keeps no per-process samples.
	SMUtilization     *uint32 `json:"smUtilization,omitempty"`
	MemoryUtilization *uint32 `json:"memoryUtilization,omitempty"`
}
