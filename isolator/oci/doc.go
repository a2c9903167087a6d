// Package oci applies an isolator.Plan to an OCI runtime spec, so that runc,
// containerd and CRI-O users get the same isolation as gpuiso's own
// containerizers: the device nodes (Linux.Devices), their allow rules behind
// a deny-all (Linux.Resources.Devices), the mounts (such as the read-only
// driver volume) and the environment.
package oci
