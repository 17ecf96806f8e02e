#!/usr/bin/env bash
# The whole test suite on a fresh machine: set-up, lint, types, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
echo "== ruff"
.venv/bin/ruff check tectonic_emu fuse_mount clients bench tests
echo "== mypy (strict on tectonic_emu)"
.venv/bin/mypy tectonic_emu
echo "== pytest"
.venv/bin/pytest -q "$@"
