# gpuiso's developer entry points. `make test` is the full test command: it
# provisions the host (as root, idempotently) and runs every suite with the
# privileged ones required, so that a suite that cannot run fails the build.
# (`bash .ci/test.sh` does the same on a host without make.)

GO ?= go
GOTESTFLAGS ?= -race -count=1 -timeout 60m
export PATH := $(PATH):/usr/local/go/bin
# go-nvml's cgo prolog names every deprecated NVML call. Set, not defaulted:
# every entry point (this file, .ci/env.sh) builds with exactly these flags,
# so they share one build cache and none prints the warnings, whatever the
# caller's environment holds.
export CGO_CFLAGS := -O2 -g -Wno-deprecated-declarations

.PHONY: all test provision check unit demo build probe-image plugin-image gocheck gpurun gpuinfo hwtest hwrun nomad-plugin nomad-proto

all: check unit

## gocheck: the go command is at least the version go.mod states (one line if not)
gocheck:
	@bash .ci/gocheck.sh

## test: provision the host, then run every suite; required suites may not skip
## (the nested kubernetes/ and nomad/ modules' suites too)
test: gocheck provision check
	GPUISO_REQUIRE=all $(GO) test $(GOTESTFLAGS) ./...
	bash .ci/k8s-build.sh
	bash .ci/helm-build.sh
	cd kubernetes && GPUISO_REQUIRE=all $(GO) test $(GOTESTFLAGS) ./...
	cd nomad && GPUISO_REQUIRE=all $(GO) test $(GOTESTFLAGS) ./...

## build: the programs (cmd/ and examples/) into bin/
build: gocheck
	$(GO) build -o bin/ $$($(GO) list ./examples/... | grep -v /examples/gpuiso-runtime$$) ./cmd/...

## plugin-image: bin/gpuiso-kubelet-plugin.tar, the kubelet plugin's image as an OCI archive (no registry, no Docker build): ctr -n k8s.io images import it on each node
plugin-image: gocheck
	cd kubernetes && $(GO) build -ldflags='-s -w' -o ../bin/gpuiso-kubelet-plugin ./cmd/gpuiso-kubelet-plugin
	cd kubernetes && $(GO) run ./internal/cmd/plugin-image -program ../bin/gpuiso-kubelet-plugin -o ../bin/gpuiso-kubelet-plugin.tar

## nomad-plugin: bin/gpuiso-nomad-plugin, the Nomad device plugin (copy it into the client's plugin_dir)
nomad-plugin: gocheck
	cd nomad && $(GO) build -o ../bin/gpuiso-nomad-plugin ./cmd/gpuiso-nomad-plugin

## nomad-proto: regenerate the Go code of Nomad's plugin protocol from nomad/internal/proto/*/*.proto (protoc: apt-get install protobuf-compiler)
nomad-proto:
	GO=$(GO) bash nomad/internal/proto/generate.sh

## probe-image: the examples' image gpuiso-probe, built locally (no registry) for Docker and Podman, and bin/gpuiso-probe.tar
probe-image:
	bash .ci/probe-image.sh

## provision: Debian non-free NVIDIA user-space driver, docker.io, a running dockerd
provision:
	bash .ci/provision.sh

# The packages that neither talk to NVML nor need Linux: the node model, the
# allocator, volume logic, the isolation plans and renderings, the Docker
# back end. They must build without cgo and for another GOOS.
PURE := ./node ./node/attributes ./record ./allocator ./volume ./isolator/... ./containerizer ./containerizer/docker ./containerizer/rootfs ./internal/ldcache ./internal/linux

## check: formatting, import groups (standard library, other modules, gpuiso's
## own last: .ci/imports.go), vet, staticcheck (pinned by go.mod's tool
## directive, checks in staticcheck.conf), the OS seam (only internal/linux
## imports syscall or x/sys/unix), and the pure packages built without cgo and
## for darwin
check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	git ls-files '*.go' | grep -v '\.pb\.go$$' | $(GO) run .ci/imports.go
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	GO=$(GO) bash .ci/syscall-rule.sh
	CGO_ENABLED=0 $(GO) build $(PURE)
	CGO_ENABLED=0 GOOS=darwin $(GO) build $(PURE)
	cd kubernetes && $(GO) vet ./... && $(GO) tool staticcheck ./...
	cd nomad && $(GO) vet ./... && $(GO) tool staticcheck ./...
	GO=$(GO) bash nomad/internal/proto/generate.sh --check

## unit: the suites that need nothing of the host (privileged ones skip); PKG=./dir and RUN=regexp narrow it
## (without PKG, the nested kubernetes/ and nomad/ modules' too)
unit: gocheck
	$(GO) test -count=1 $(if $(RUN),-v -run '$(RUN)') $(or $(PKG),./...)
	$(if $(PKG),,cd kubernetes && $(GO) test -count=1 $(if $(RUN),-v -run '$(RUN)') ./...)
	$(if $(PKG),,cd nomad && $(GO) test -count=1 $(if $(RUN),-v -run '$(RUN)') ./...)

## demo: the README's first command: a GPU container on a simulated DGX-1 (root)
demo:
	bash .ci/demo.sh

## gpurun: run a command as a GPU container on a simulated node (root)
gpurun: build
	bin/gpurun --simulate $(or $(SIM),dgx1-volta) --gpus 2 -- ls -l /dev

## gpuinfo: what this node has (SIM=dgx1-volta to use a simulated node)
gpuinfo: build
	bin/gpuinfo $(if $(SIM),--simulate $(SIM))

## hwtest: build the hardware suite into hwbundle/ (test binaries, probe, cudacheck, run.sh, tarball)
hwtest:
	bash internal/testing/hwtest/bundle.sh hwbundle

## hwrun: run the hardware suite on this node (root, NVIDIA GPUs); builds it first if needed
hwrun: $(if $(wildcard hwbundle/run.sh),,hwtest)
	bash hwbundle/run.sh
