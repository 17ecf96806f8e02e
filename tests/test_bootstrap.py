"""scripts/bootstrap.sh: it waits for a held apt lock, shows progress, and the README says
everything it installs."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"


def test_the_readme_lists_everything_bootstrap_installs() -> None:
    script = (SCRIPTS / "bootstrap.sh").read_text()
    readme = (REPO / "README.md").read_text()
    debian = re.findall(r"need_apt\+=\(([\w.-]+)\)", script)
    extras = re.search(r"^extras=([\w,]+)$", script, re.M)
    assert debian and extras is not None
    for name in [*debian, *extras.group(1).split(","), "torch"]:
        assert f"`{name}`" in readme, f"README does not say bootstrap installs {name}"


def run_logged(label: str, log: Path, command: str) -> subprocess.CompletedProcess[str]:
    """``run_logged LABEL LOG bash -c COMMAND`` (scripts/progress.sh), then ``echo after``;
    stderr is not a terminal, as in CI."""
    shell = f"source {SCRIPTS / 'progress.sh'}; run_logged '{label}' {log} bash -c '{command}'"
    return subprocess.run(
        ["bash", "-c", f"{shell}; echo after"], capture_output=True, text=True, timeout=60
    )


def test_a_long_step_shows_its_progress_and_how_long_it_took(tmp_path: Path) -> None:
    log = tmp_path / "step.log"
    r = run_logged("pip install", log, "for i in $(seq 18); do echo Collecting p$i; sleep 1; done")
    assert r.returncode == 0 and r.stdout == "after\n", r.stderr
    # Not a terminal: a line every 15 s naming the step, the seconds and the log's last line.
    assert re.search(r"pip install: 15s\s+Collecting p1\d", r.stderr), r.stderr
    assert re.search(r"pip install: done in (1[89]|2[0-9])s", r.stderr), r.stderr
    assert "Collecting p18" in log.read_text()


def test_a_failed_step_shows_the_end_of_its_log(tmp_path: Path) -> None:
    r = run_logged("apt-get install", tmp_path / "step.log", "echo E: no such package; exit 100")
    assert r.returncode == 1
    assert "apt-get install failed" in r.stderr and "E: no such package" in r.stderr
    assert "after" not in r.stdout  # the script stopped there


def hold(path: str, seconds: float, held: threading.Event) -> None:
    """Hold apt's fcntl lock on ``path`` for ``seconds``, as a running dpkg does."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        held.set()
        time.sleep(seconds)
    finally:
        os.close(fd)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("apt-get") is None or shutil.which("ip") is None,
    reason="installs through apt-get (as root), of a package already here (iproute2)",
)
@pytest.mark.parametrize("lock", ["/var/lib/dpkg/lock-frontend", "/var/lib/apt/lists/lock"])
def test_apt_install_waits_for_a_held_lock_instead_of_failing(lock: str) -> None:
    held = threading.Event()
    holder = threading.Thread(target=hold, args=(lock, 4.0, held))
    holder.start()
    try:
        assert held.wait(10)
        t0 = time.monotonic()
        r = subprocess.run(
            [str(SCRIPTS / "apt-install.sh"), "iproute2"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        took = time.monotonic() - t0
    finally:
        holder.join()
    assert r.returncode == 0, r.stderr
    assert f"waiting for apt: {lock} is held by process {os.getpid()}" in r.stderr, r.stderr
    assert "Could not get lock" not in r.stderr
    assert took >= 3.5, took


@pytest.mark.skipif(os.geteuid() != 0, reason="apt's locks are root's")
def test_apt_install_gives_up_in_one_line_after_its_wait(tmp_path: Path) -> None:
    held = threading.Event()
    holder = threading.Thread(target=hold, args=("/var/lib/dpkg/lock-frontend", 5.0, held))
    holder.start()
    try:
        assert held.wait(10)
        r = subprocess.run(
            [str(SCRIPTS / "apt-install.sh"), "iproute2"],
            env={**os.environ, "APT_LOCK_WAIT": "2"},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        holder.join()
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1].startswith("bootstrap: gave up after 2s: "), r.stderr
