// Package e2e holds gpuiso's end-to-end suite for Kubernetes: pods on a
// real one-node cluster (internal/cluster: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, a kubelet and containerd 2 from
// the pinned build) get GPUs of a simulated node from gpuiso-kubelet-plugin
// run as a process, through the device plugin and through DRA claims, and
// report from inside which GPUs they may open. The package has tests only;
// see kubernetes/README.md for what they prove and how to run them.
package e2e
