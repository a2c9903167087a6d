// Package cluster runs a real one-node Kubernetes cluster for gpuiso's
// end-to-end tests: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, a kubelet and containerd 2 (whose CRI applies CDI
// devices), all from the pinned build of .ci/k8s-build.sh, on 127.0.0.1
// beside whatever else the host runs.
//
// # What it owns
//
// Start makes one directory under /run/gpuiso-test and keeps
// everything of the cluster in it: etcd's data, the API server's
// certificates and credentials (a static admin token), containerd's root,
// state, sockets and runc root, the kubelet's root directory (its plugins/
// and plugins_registry/ directories, where a DRA kubelet plugin
// registers), pod logs, a CDI directory (CDIDir) containerd reads, and a
// device-plugin directory (DevicePluginDir). Every server listens on free
// 127.0.0.1 ports or on sockets in that directory. The kubelet runs with
// the cgroupfs driver under a cgroup root of its own (the directory's
// name), made beforehand in every cgroup v1 hierarchy.
//
// The kubelet runs in a mount namespace of its own. There, copies of the
// /proc/sys files it would rewrite (vm.overcommit_memory, kernel.panic,
// ...) and the cluster's device-plugin directory are bound over the host's
// (the kubelet's device-plugin directory, /var/lib/kubelet/device-plugins,
// is a constant of the kubelet), and /var/log, where it links container
// logs at another fixed path, is a tmpfs; so the host is left as it was.
// Where the host lacks /var/lib/kubelet/device-plugins, the mount point is
// made and recorded, and the last cluster to stop removes it (not an
// earlier one: removing a directory another kubelet has a mount on would
// detach that mount). The cluster's directory is made a shared mount
// first, so what the kubelet mounts there reaches containerd.
//
// Pods run on the host's network (no CNI: a configuration naming a plugin
// that is never run lets the runtime report its network ready) and use
// images imported from local files (ImportImage; imagePullPolicy: Never).
// The sandbox ("pause") image is a static program that sleeps until it is
// killed.
//
// # Lifecycle
//
// Start returns once the Node is Ready and the default ServiceAccount
// exists (about ten seconds). Stop deletes the pods, stops the kubelet,
// removes containerd's containers, stops every process, kills what is
// left in the cluster's cgroups (containerd's shims and the pods'
// processes included), unmounts everything under the directory, removes
// the cgroups and the directory. Leftovers then lists whatever of the
// cluster still exists on the host (processes, mounts, cgroups, files):
// nothing, when the teardown worked.
//
// The control plane, containerd and the kubelet get SIGKILL when the test
// process dies; containerd's shims and the pods outlive it. Each cluster's
// directory names its owner (pid and start time), and Start first reaps
// (Reap) the clusters whose owner is dead, as Stop would have.
//
// Processes are recorded as pid and start time, so that a reused pid is
// never signalled; a zombie counts as gone.
package cluster
