#!/usr/bin/env bash
# The README's test command: as root, on Debian 12 with Go installed and
# nothing else, it checks Go, provisions the host idempotently (make
# included), then runs `make test`: every suite, the privileged ones required.
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/env.sh
bash .ci/provision.sh
exec make test
