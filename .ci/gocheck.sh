#!/usr/bin/env bash
# Checks that the go command is at least the version go.mod states; says so
# in one line and exits 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
want=$(sed -n 's/^go \([0-9.]*\)$/\1/p' go.mod)
go=$(command -v go || true)
if [ -z "$go" ]; then
  echo "gpuiso needs Go $want or later (go.mod) and finds no go command: install it from https://go.dev/dl/ into /usr/local/go" >&2
  exit 1
fi
# The Go that builds here: a go command of 1.21 or later fetches the toolchain
# go.mod asks for (unless GOTOOLCHAIN=local), an older one cannot.
have=$("$go" env GOVERSION 2>/dev/null || "$go" version | awk '{print $3}')
have=${have#go}
have=${have%% *}
if [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n1)" != "$want" ]; then
  echo "gpuiso needs Go $want or later (go.mod); $go is go$have: install Go from https://go.dev/dl/ into /usr/local/go and put /usr/local/go/bin first in PATH" >&2
  exit 1
fi
