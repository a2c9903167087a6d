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
//
// Every Go block (fenced "go") of the same documents is compiled against
// the module as it is, each as a package of its own laid over the module
// (go build -overlay): a block of declarations as a file, any other as
// the body of a function returning error. What the text around a block
// takes for granted is given: the packages of [Imports] by their names,
// and the values of [Given] (ctx, inv, a, ...); a variable a block
// declares only to show a result may stay unused. A compiler error names
// the document's file and line. Go snippets that are not meant to compile
// have no place in the documents.
//
// Beside them, TestNoInternalTypeInAPI checks that no exported name of a
// package a user may import has a type of an internal package in its
// signature: what the documents teach can be written by a user.
package readme
