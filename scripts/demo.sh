#!/usr/bin/env bash
# The main job on a fresh machine: set-up, then the end-to-end demo on an embedded cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/tectonic-emu demo "$@"
