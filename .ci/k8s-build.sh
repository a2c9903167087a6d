#!/usr/bin/env bash
# Builds a pinned one-node Kubernetes (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, kubectl) and containerd 2
# (with its runc shim and ctr) from the Go module proxy into a cache outside
# the repository, static (CGO_ENABLED=0). Idempotent: binaries already built
# for these versions are kept, so a warm run does nothing.
#
#   .ci/k8s-build.sh            # builds into $GPUISO_K8S_CACHE (default below)
#
# k8s.io/kubernetes and etcd's server module cannot be built as they are
# published: their go.mod replaces sibling modules with local paths. A small
# wrapper module requires them and replaces each such module with its
# published version.
set -euo pipefail

K8S=v1.37.2
STAGING=v0.37.2
ETCD=v3.7.3
CONTAINERD=v2.4.2
CACHE=${GPUISO_K8S_CACHE:-/var/cache/gpuiso/k8s-$K8S}
B=$CACHE/bin
export PATH=$PATH:/usr/local/go/bin CGO_ENABLED=0 GOFLAGS=-mod=mod

k8s_cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
ctd_cmds=(containerd containerd-shim-runc-v2 ctr)

missing=0
for c in "${k8s_cmds[@]}" etcd "${ctd_cmds[@]}"; do [ -x "$B/$c" ] || missing=1; done
if [ $missing = 0 ]; then
	echo "k8s-build: $B up to date"
	exit 0
fi
mkdir -p "$B" "$CACHE/src/k8s" "$CACHE/src/etcd" "$CACHE/src/containerd"

# Kubernetes: the staging modules at their published versions.
cd "$CACHE/src/k8s"
if [ ! -f .ready ]; then
	rm -f go.mod go.sum
	go mod init gpuiso.local/k8s
	gomod=$(go mod download -json "k8s.io/kubernetes@$K8S" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
	[ -f "$gomod" ] || { echo "k8s-build: no go.mod for k8s.io/kubernetes@$K8S" >&2; exit 1; }
	for m in $(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$gomod"); do
		go mod edit -replace="$m=$m@$STAGING"
	done
	go mod edit -require="k8s.io/kubernetes@$K8S"
	for c in "${k8s_cmds[@]}"; do go get -tool "k8s.io/kubernetes/cmd/$c@$K8S"; done
	touch .ready
fi
for c in "${k8s_cmds[@]}"; do
	[ -x "$B/$c" ] || nice go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S" \
		-o "$B/$c.tmp" "k8s.io/kubernetes/cmd/$c" && mv "$B/$c.tmp" "$B/$c"
done

# etcd: its api, client and pkg modules at the server's version.
cd "$CACHE/src/etcd"
if [ ! -f .ready ]; then
	rm -f go.mod go.sum
	go mod init gpuiso.local/etcd
	for m in api/v3 client/pkg/v3 client/v3 pkg/v3; do
		go mod edit -replace="go.etcd.io/etcd/$m=go.etcd.io/etcd/$m@$ETCD"
	done
	go get -tool "go.etcd.io/etcd/server/v3@$ETCD"
	touch .ready
fi
[ -x "$B/etcd" ] || { nice go build -trimpath -ldflags "-s -w" -o "$B/etcd.tmp" go.etcd.io/etcd/server/v3 && mv "$B/etcd.tmp" "$B/etcd"; }

# containerd 2 (its CRI reads CDI specs).
cd "$CACHE/src/containerd"
if [ ! -f .ready ]; then
	rm -f go.mod go.sum
	go mod init gpuiso.local/containerd
	for c in "${ctd_cmds[@]}"; do go get -tool "github.com/containerd/containerd/v2/cmd/$c@$CONTAINERD"; done
	touch .ready
fi
for c in "${ctd_cmds[@]}"; do
	[ -x "$B/$c" ] || { nice go build -trimpath -tags 'no_btrfs no_devmapper no_zfs' -ldflags "-s -w" \
		-o "$B/$c.tmp" "github.com/containerd/containerd/v2/cmd/$c" && mv "$B/$c.tmp" "$B/$c"; }
done
ls -l "$B"
