// Package readme keeps the documentation honest: its tests extract every
// shell block of README.md and examples/**/README.md marked runnable and run
// it, as root on the provisioned host, each with a timeout, so that no
// documented command can rot; and they check that no documented entry point
// prints a compiler warning, whatever the caller's environment.
//
// A runnable block is fenced with the info string "sh runnable", optionally
// followed by what it needs ("docker", "podman") and a timeout
// ("timeout=10m", default 5m):
//
//	```sh runnable docker
//	make build probe-image
//	bin/dockerrun --simulate dgx1-volta --gpus 2 gpuiso-probe ls /dev
//	```
//
// Each block runs with bash -euo pipefail from the repository root, in the
// order the files and blocks come (README.md first), without CGO_CFLAGS in
// its environment.
package readme
