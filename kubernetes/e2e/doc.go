// Package e2e holds gpuiso's end-to-end suite for Kubernetes, on a real
// three-node cluster (internal/cluster: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, and per node a kubelet and
// containerd 2, from the pinned build), each node simulating a GPU node
// of its own kind. TestHelm installs gpuiso as a user does (the plugin's
// image in each node's containerd, `helm install` of the chart in
// kubernetes/deploy) and checks placement, bin-packing, quotas, a rolling
// upgrade, a drain, the cost at cluster scale and a clean uninstall;
// TestChart keeps the chart and the plain manifests valid against the API
// server; the other tests run gpuiso-kubelet-plugin as a process on the
// first node, through the device plugin and through DRA claims. Pods
// report from inside which GPUs they may open. The package has tests
// only; see kubernetes/README.md for what they prove and how to run them.
package e2e
