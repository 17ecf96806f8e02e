"""The README's walk-through runs as written.

The code blocks under Quick start, Served, Mounted, Checkpoints, From Python, Tenants and
Traffic groups run in the order they appear, as one bash script in a scratch directory
(python blocks through ``python - <<EOF``), with this virtualenv's ``bin`` first on PATH, as
a user's shell would have after ``source .venv/bin/activate``. Nothing in them is
rewritten, so the README cannot drift from the code. Whatever the script leaves running (a
served cluster, mounts) is stopped after.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
RUN = (
    "Quick start",
    "Served",
    "Mounted",
    "Checkpoints",
    "From Python",
    "Tenants",
    "Traffic groups",
)


def readme_blocks(text: str) -> list[tuple[str, str, str]]:
    """``(section, language, code)`` for every fenced block, in order; ``section`` is the
    nearest heading above it."""
    blocks: list[tuple[str, str, str]] = []
    section = ""
    fence = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
    pos = 0
    for m in fence.finditer(text):
        for h in re.findall(r"^#{2,3} (.+)$", text[pos : m.start()], re.M):
            section = h.strip()
        blocks.append((section, m.group(1), m.group(2)))
        pos = m.end()
    return blocks


def walkthrough(text: str) -> str:
    """The README's runnable blocks as one bash script."""
    lines = ["set -euo pipefail"]
    for section, lang, code in readme_blocks(text):
        if section not in RUN:
            continue
        lines.append(f"echo '== README: {section} ({lang})' >&2")
        if lang == "sh":
            lines.append(code)
        elif lang == "python":
            assert "\nPY_README\n" not in code
            lines.append(f"python - <<'PY_README'\n{code}PY_README")
        else:
            raise AssertionError(f"a {lang or 'plain'} block under {section}: sh or python")
    return "\n".join(lines) + "\n"


def test_the_readme_names_every_section_it_runs() -> None:
    sections = {s for s, _, _ in readme_blocks(README.read_text())}
    assert set(RUN) <= sections, set(RUN) - sections


def fuse_usable() -> bool:
    return os.geteuid() == 0 and os.path.exists("/dev/fuse") and bool(shutil.which("fusermount3"))


@pytest.mark.skipif(not fuse_usable(), reason="the Mounted block needs root, /dev/fuse, fuse3")
def test_the_readme_runs_as_written(tmp_path: Path) -> None:
    script = tmp_path / "readme.sh"
    script.write_text(walkthrough(README.read_text()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TECTONIC_EMU")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "80"
    try:
        r = subprocess.run(
            ["bash", str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        _clean_up(tmp_path, env)
    shown = f"stdout:\n{r.stdout[-4000:]}\nstderr:\n{r.stderr[-4000:]}"
    assert r.returncode == 0, shown
    assert "Traceback" not in r.stderr, shown
    for section in RUN:
        assert f"== README: {section}" in r.stderr, shown
    assert "[20, 30]" in r.stdout, shown  # keep_last=2 honoured as soon as save returned
    assert "b'weig'" in r.stdout, shown
    assert (tmp_path / "c2" / "cluster.json").exists()


def _clean_up(root: Path, env: dict[str, str]) -> None:
    """Stop a serve and unmount whatever the script left behind, even when it failed."""
    tecto = [sys.executable, "-m", "tectonic_emu"]
    if (root / "c1" / "serve.json").exists():
        subprocess.run([*tecto, "serve", "--stop", "--cluster", str(root / "c1")], env=env)
    with open("/proc/self/mounts") as f:
        mounted = [line.split()[1] for line in f if str(root) in line]
    for mnt in mounted:
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)
