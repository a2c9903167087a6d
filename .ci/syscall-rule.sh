#!/usr/bin/env bash
# The OS seam: among the library's packages only internal/linux may import
# syscall or golang.org/x/sys/unix (in non-test files, for every GOOS the
# library builds for). Programs (cmd/, examples/) are not the library.
set -euo pipefail

module=github.com/gpuiso/gpuiso
allowed=(
	"$module/internal/linux"
	# Test support: linked into test binaries only, never into the library.
	"$module/internal/testing/testenv"
	# The example programs' shared command line (signals, exit codes): part
	# of the programs, never imported by the library.
	"$module/internal/cli"
)

GO=${GO:-go}
bad=0
for goos in linux darwin; do
	while read -r pkg imports; do
		case "$pkg" in "$module"/examples/* | "$module"/cmd/*) continue ;; esac
		for a in "${allowed[@]}"; do [ "$pkg" = "$a" ] && continue 2; done
		for imp in $imports; do
			if [ "$imp" = syscall ] || [ "$imp" = golang.org/x/sys/unix ]; then
				echo "$pkg ($goos) imports $imp: only internal/linux may" >&2
				bad=1
			fi
		done
	done < <(GOOS=$goos "$GO" list -e -f '{{.ImportPath}}{{range .Imports}} {{.}}{{end}}' ./...)
done
exit $bad
