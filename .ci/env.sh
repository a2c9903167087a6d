# Sourced by every documented entry point (.ci/demo.sh, .ci/test.sh,
# .ci/probe-image.sh; the Makefile sets the same): the same Go, checked
# against go.mod, and the same cgo flags whoever calls, so that one build
# cache serves them all and no build prints go-nvml's deprecation warnings.
# go-nvml's cgo prolog names every deprecated NVML call; the flags are
# exactly the Makefile's (a different value would rebuild, and warn).
export CGO_CFLAGS='-O2 -g -Wno-deprecated-declarations'
# Go from go.dev installs into /usr/local/go; root's PATH on Debian lacks it.
case ":$PATH:" in *:/usr/local/go/bin:*) ;; *) export PATH="$PATH:/usr/local/go/bin" ;; esac
bash "$(dirname "${BASH_SOURCE[0]}")/gocheck.sh"
