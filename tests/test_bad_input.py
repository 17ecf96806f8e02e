"""Bad numbers on the command line get one stderr line, never a traceback, and the exit code
docs/errors.md gives: 1 for a value the command refuses (EINVAL, ENOSPC), 2 for a usage error."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tectonic_emu.config import MAX_SIZE, parse_duration, parse_size
from tectonic_emu.errors import InvalidArgumentError

from .test_cli import tecto


def refused(*args: str, code: int, mentions: str, cluster: Path | None = None) -> str:
    r: subprocess.CompletedProcess[bytes] = tecto(*args, cluster=cluster)
    err = r.stderr.decode()
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, f"want one line on stderr, got {err!r}"
    assert r.returncode == code, (args, r.returncode, err)
    assert mentions in lines[0], (mentions, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bad") / "c"
    assert tecto("cluster", "create", "--nodes", "9", cluster=root).returncode == 0
    return root


@pytest.mark.parametrize(
    ("args", "code", "mentions"),
    [
        (("demo", "--size", "99999999999999999999999TiB"), 1, "size too large"),
        (("demo", "--size", "0"), 1, "--size must be at least 1 MiB (less takes too little"),
        (("demo", "--size", "-4MiB"), 1, "a size cannot be negative"),
        (("demo", "--size", "inf"), 1, "not a size: 'inf'"),
        (("demo", "--size", "1e9"), 1, "not a size: '1e9'"),
        # PiB is a unit now: the size parses and is then found not to fit.
        (
            ("demo", "--size", "1PiB"),
            1,
            "--size 1 PiB does not fit: this run needs ~3 PiB in memory",
        ),
        (("node", "slow", "5", "-100ms"), 1, "a duration cannot be negative: '-100ms'"),
        (("node", "slow", "5", "nanms"), 1, "not a duration: 'nanms'"),
        (("node", "slow", "5", "1e400s"), 1, "not a duration"),
        (("node", "slow", "5", "9999999h"), 1, "duration too long"),
        (("serve", "--repair-after", "-1s"), 1, "a duration cannot be negative"),
        (("node", "stop", "-1"), 2, "-1 is not an option, and this command takes no negative"),
        (("serve", "--buffers", "0"), 2, "0 is not in the range 1<=x<=1024"),
        (("cluster", "create", "--block-size", "1PiB"), 1, "block size must be"),
        (
            ("simulate", "train", "--workload", "unet3d", "-n", "100000000"),
            2,
            "not in the range 1<=x<=65536",
        ),
    ],
)
def test_a_bad_number_gets_one_line(
    cluster: Path, args: tuple[str, ...], code: int, mentions: str
) -> None:
    refused(*args, code=code, mentions=mentions, cluster=cluster)


def test_a_usage_error_is_one_line_naming_the_command(tmp_path: Path) -> None:
    line = refused("ls", code=2, mentions="Missing option '--cluster'")
    assert line.startswith("tectonic-emu ls: error: ") and "tectonic-emu ls --help" in line


UNITS = {"": 0, "B": 0, "K": 10, "KiB": 10, "KB": 10, "M": 20, "MiB": 20, "G": 30}
UNITS |= {"GiB": 30, "T": 40, "TiB": 40, "P": 50, "PiB": 50, "E": 60, "EiB": 60}


@given(st.integers(min_value=0, max_value=1 << 70), st.sampled_from(sorted(UNITS)))
def test_sizes_parse_exactly_or_say_too_large(n: int, unit: str) -> None:
    want = n << UNITS[unit]
    if want > MAX_SIZE:
        with pytest.raises(InvalidArgumentError, match="too large"):
            parse_size(f"{n}{unit}")
    else:
        assert parse_size(f"{n}{unit}") == want
        assert parse_size(f" {n} {unit.lower()} ") == want


@given(st.text(max_size=30))
def test_any_text_is_a_size_or_an_invalid_argument(text: str) -> None:
    try:
        value = parse_size(text)
    except InvalidArgumentError as e:
        assert repr(text) in str(e)  # the text as given, quoted, even when unprintable
    else:
        assert 0 <= value <= MAX_SIZE


@given(st.text(max_size=30))
def test_any_text_is_a_duration_or_an_invalid_argument(text: str) -> None:
    try:
        value = parse_duration(text)
    except InvalidArgumentError:
        pass
    else:
        assert 0 <= value <= 365 * 86400


def test_fractions_and_minimums() -> None:
    assert parse_size("1.5GiB") == 3 << 29
    assert parse_size(".5K") == 512
    assert parse_duration("50ms") == pytest.approx(0.05)
    assert parse_duration("5min") == 300
    with pytest.raises(InvalidArgumentError, match="at least 1 MiB"):
        parse_size("1023KiB", minimum=1 << 20)
