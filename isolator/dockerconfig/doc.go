// Package dockerconfig applies an isolator.Plan to a Docker container's
// configuration, for containerizers that run GPU containers through the
// Docker daemon's API rather than its NVIDIA runtime hook (--gpus needs the
// hook on the daemon's host; this does not).
//
// [New] turns a plan into a [Config], plain data: one device mapping per
// node of the plan (the control devices, then the GPUs), each from the host's
// dev root to /dev/<name> in the container with the cgroup permissions "rwm"
// (the daemon copies them as given), a read-only bind mount per mount of the
// plan (the driver volume at /usr/local/nvidia when the image asks for it),
// the environment (NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES, the
// volume's PATH and LD_LIBRARY_PATH) and labels recording the owner and its
// GPUs. [Config.Apply] writes it into a container.Config and
// container.HostConfig before ContainerCreate; [ParseLabels] reads the labels
// back from a container the daemon lists, so that GPU ownership survives a
// restart of whoever created it.
//
// The daemon creates the device nodes in the container's own /dev and allows
// exactly them in the container's device cgroup; every other GPU is absent
// and denied. Device rules of an existing container cannot be changed
// through the Docker API (moby #42255): a container keeps the GPUs it was
// created with.
//
// Docker's mount API cannot say nosuid or nodev for a bind mount; the
// volume's files are root-owned and read-only, and the container's /dev is
// the daemon's own, so neither option would change what a container can do.
package dockerconfig
