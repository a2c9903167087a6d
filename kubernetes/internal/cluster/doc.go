// Package cluster runs a real Kubernetes cluster of one or more nodes for
// gpuiso's end-to-end tests: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler and, per node, a kubelet and a
// containerd 2 (whose CRI applies CDI devices), all from the pinned build
// of .ci/k8s-build.sh, on loopback addresses beside whatever else the
// host runs.
//
// # What it owns
//
// Start makes one directory under /run/gpuiso-test and keeps
// everything of the cluster in it: etcd's data, the API server's
// certificates and credentials (a static admin token), and a directory
// per node (n1, n2, ...) with containerd's root, state, sockets and runc
// root, the kubelet's root directory (its plugins/, plugins_registry/
// and device-plugins/ directories, where a kubelet plugin registers), pod
// logs, a CDI directory containerd reads and gpuiso's plugin state
// directory. Every server listens on free ports or on sockets in that
// directory. Node i is named 127.0.0.<i+1>: its name, its InternalIP and
// its kubelet's address (the kubelet refuses a loopback --node-ip, and
// takes an IP given as the host name as the Node's address). Each
// kubelet runs with the cgroupfs driver under a cgroup root of its own
// below the cluster's (the directory's name), made beforehand in every
// cgroup v1 hierarchy, or on a cgroup2-only host in the one hierarchy with
// its controllers enabled down to the roots. The controller-manager publishes the API server's
// own CA (kube-root-ca.crt), so that pods' service accounts can talk to
// it; the scheduler runs with Config.SchedulerConfig when given.
//
// A node's containerd and kubelet share a mount namespace of the node's
// own, made private so that nothing of it reaches the host. There the
// node's directories are bound over HostPaths (/var/lib/kubelet,
// /var/run/cdi, /var/lib/gpuiso-kubelet-plugin): the kubelet's root
// directory is /var/lib/kubelet (its device-plugin directory there is a
// constant of the kubelet), and a DaemonSet's hostPath volumes on the node
// see the node's own directories, as on separate machines. Copies of the
// /proc/sys files the kubelet would rewrite (vm.overcommit_memory,
// kernel.panic, ...) are bound over the host's, and /var/log, where it
// links container logs at a fixed path, is a tmpfs; so the host is left
// as it was. Where the host lacks a host path, the mount point is made
// and recorded, and the last cluster to stop removes it if it is still
// empty (not an earlier one: removing a directory another node has a
// mount on would detach that mount).
//
// Pods run on the host's network (no CNI: a configuration naming a plugin
// that is never run lets the runtime report its network ready) and use
// images imported from local files (ImportImage; imagePullPolicy: Never).
// The sandbox ("pause") image is a static program that sleeps until it is
// killed.
//
// # Lifecycle
//
// Start returns once every Node is Ready and the default ServiceAccount
// exists (about ten seconds for one node). Stop deletes the pods, stops
// the kubelets, removes each containerd's containers, stops every process,
// kills what is left in the cluster's cgroups (containerd's shims and the
// pods' processes included), unmounts everything under the directory,
// removes the cgroups and the directory. Leftovers then lists whatever of the
// cluster still exists on the host (processes, mounts, cgroups, files):
// nothing, when the teardown worked.
//
// Reboot reboots one node as a power cut and a boot would: its kubelet,
// containerd, shims and pods get SIGKILL (the node's mount namespace, and
// every mount in it, goes with them), what a node keeps under /run (the
// CDI directory, containerd's state, runc's root, the shim sockets) is
// emptied and its cgroups are made afresh, while its disk state
// (containerd's root, the kubelet's root with its checkpoints, the plugin
// state directory) stays; containerd and the kubelet then start again,
// and the kubelet starts the node's pods again as after a real reboot.
//
// The control plane, the containerds and the kubelets get SIGKILL when the test
// process dies; containerd's shims and the pods outlive it. Each cluster's
// directory names its owner (pid and start time), and Start first reaps
// (Reap) the clusters whose owner is dead, as Stop would have.
//
// Processes are recorded as pid and start time, so that a reused pid is
// never signalled; a zombie counts as gone.
package cluster
