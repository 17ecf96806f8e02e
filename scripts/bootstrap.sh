#!/usr/bin/env bash
# Make this checkout runnable on a fresh machine: system packages (when root), a virtualenv in
# .venv, and the project installed editable with its test tools. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .venv

source scripts/progress.sh

need_apt=()
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # fuse3 serves the FUSE mount (issue 4); the store itself needs nothing from apt.
    command -v fusermount3 >/dev/null || need_apt+=(fuse3)
    # fio drives the mount in its tests (sequential and random writes with verification).
    command -v fio >/dev/null || need_apt+=(fio)
    # GlusterFS is one of the peers bench checkpoint compares against (issue 7).
    command -v glusterd >/dev/null || need_apt+=(glusterfs-server)
    # PostgreSQL: the metadata backend for clusters across hosts (issue 8); the tests start
    # a private server of their own from its binaries (bench/postgres.py), as bench metadata does.
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need_apt+=(postgresql)
    # ip (iproute2): hosts as network namespaces for the multi-host tests (bench/netns.py).
    command -v ip >/dev/null || need_apt+=(iproute2)
    # autoconf, automake, libtool build pjdfstest, the POSIX suite bench posix runs on the
    # mount (issue 21; gcc, make, pkg-config and perl's prove come with the base system).
    command -v autoreconf >/dev/null || need_apt+=(autoconf)
    command -v automake >/dev/null || need_apt+=(automake)
    command -v libtoolize >/dev/null || need_apt+=(libtool)
    if [ ${#need_apt[@]} -gt 0 ]; then
        scripts/apt-install.sh "${need_apt[@]}"
    fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
extras=dev,fuse,bench,clients,peers,postgres
find_links=()
# torch (the optional extra, pinned to 2.13.0) only from the CPU wheel on this machine's disk,
# which pip prefers to PyPI's release of the same version (a CUDA build of several GB).
# Without that file the torch extra is left out, and the tests that need torch skip.
wheels=${PIP_FIND_LINKS:-/opt/wheels}
for wheel in "$wheels"/torch-2.13.0+cpu-*.whl; do
    if [ -f "$wheel" ]; then
        extras=$extras,torch
        find_links=(--find-links "$wheels")
    fi
    break
done
stamp=.venv/.installed-$( (cat pyproject.toml; echo "$extras") | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
    echo "bootstrap: into .venv: the project with [$extras] (about 90 s when new)" >&2
    .venv/bin/pip install -q --upgrade pip >/dev/null 2>&1 || true
    run_logged "pip install" .venv/install.log \
        .venv/bin/pip install --progress-bar off "${find_links[@]}" -e ".[$extras]"
    .venv/bin/python -c "import tectonic_emu, pyeclib, google_crc32c, zstandard"
    rm -f .venv/.installed-*; touch "$stamp"
fi
