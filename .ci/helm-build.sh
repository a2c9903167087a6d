#!/usr/bin/env bash
# Builds the pinned helm command (and nothing else of Helm) from the Go
# module proxy into a cache outside the repository, static
# (CGO_ENABLED=0), for the Kubernetes suites that install gpuiso's chart.
# Idempotent: a helm already built for this version is kept, so a warm run
# does nothing.
#
#   .ci/helm-build.sh            # builds $GPUISO_HELM_CACHE/bin/helm (default below)
#
# A small wrapper module requires helm.sh/helm/v4 at the pinned version
# with a Go 1.24+ `tool` line naming its command.
set -euo pipefail

HELM=v4.3.1
CACHE=${GPUISO_HELM_CACHE:-/var/cache/gpuiso/helm-$HELM}
B=$CACHE/bin
export PATH=$PATH:/usr/local/go/bin CGO_ENABLED=0 GOFLAGS=-mod=mod

if [ -x "$B/helm" ]; then
	echo "helm-build: $B/helm up to date"
	exit 0
fi
mkdir -p "$B" "$CACHE/src"
cd "$CACHE/src"
if [ ! -f .ready ]; then
	rm -f go.mod go.sum
	go mod init gpuiso.local/helm
	go get -tool "helm.sh/helm/v4/cmd/helm@$HELM"
	touch .ready
fi
nice go build -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM" \
	-o "$B/helm.tmp" helm.sh/helm/v4/cmd/helm
mv "$B/helm.tmp" "$B/helm"
"$B/helm" version
