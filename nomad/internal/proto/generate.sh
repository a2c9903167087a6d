#!/usr/bin/env bash
# Regenerates the Go code of Nomad's plugin protocol from the .proto files
# beside this script, with protoc (Debian's protobuf-compiler) and the
# protoc-gen-go and protoc-gen-go-grpc the nomad module pins as tools.
# With --check it generates into a temporary directory and fails when the
# committed code differs (drift), changing nothing.
set -euo pipefail
cd "$(dirname "$0")"
here=$(pwd)
module=github.com/gpuiso/gpuiso/nomad/internal/proto
GO=${GO:-go}
if ! command -v protoc >/dev/null; then
	echo "protoc not found: apt-get install -y protobuf-compiler" >&2
	exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd ../.. && $GO build -o "$tmp/bin/" google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc)
mkdir "$tmp/out"
protos=(hclspec/hclspec.proto structs/structs.proto base/base.proto device/device.proto)
protoc --proto_path=. \
	--plugin=protoc-gen-go="$tmp/bin/protoc-gen-go" --plugin=protoc-gen-go-grpc="$tmp/bin/protoc-gen-go-grpc" \
	--go_out="$tmp/out" --go_opt=module="$module" \
	--go-grpc_out="$tmp/out" --go-grpc_opt=module="$module" \
	"${protos[@]}"
# protoc-gen-go names every import; an import's name that is its path's last
# element says nothing, so it goes.
find "$tmp/out" -name '*.pb.go' -exec sed -E -i 's/^\t([a-z0-9_]+) ("([^"]*\/)?\1")$/\t\2/' {} +
if [ "${1:-}" = --check ]; then
	generated=$(cd "$tmp/out" && find . -name '*.pb.go' | sort)
	committed=$(find . -name '*.pb.go' | sort)
	drift=$([ "$generated" = "$committed" ] || echo "generated files: $generated; committed: $committed")
	for f in $generated; do
		diff -u "$f" "$tmp/out/$f" >>"$tmp/diff" || drift=yes
	done
	if [ -n "$drift" ]; then
		echo "nomad/internal/proto: the generated code differs from the .proto files: run make nomad-proto" >&2
		echo "$drift" | grep -v '^yes$' >&2 || true
		cat "$tmp/diff" >&2 || true
		exit 1
	fi
	exit 0
fi
find . -name '*.pb.go' -delete
cp -r "$tmp/out/." "$here/"
