"""Served mode: every storage node is its own OS process behind a TCP port.

Each node process publishes its address in the cluster directory, and the supervisor its
control socket (the topology files, see ``nodectl.py``); ``Cluster.open`` finds them there,
reaches every node over TCP (``RemoteNode``) and never touches the node directories itself.

``run_node`` is ``tectonic-emu node serve``; ``Supervisor`` is ``tectonic-emu serve``: it
starts one ``node serve`` process per node, runs the background services, answers control
requests (``node start``) on a small JSON-lines socket, and on SIGINT/SIGTERM stops every node
and exits. ``Serving`` starts and stops a supervisor from Python (tests, benchmarks).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tectonic_emu._malloc import keep_freed_memory
from tectonic_emu.chunkstore.auth import (
    HANDSHAKE_TIMEOUT,
    AuthError,
    RefusalLog,
    accept_control,
    pack_message,
    read_message,
)
from tectonic_emu.config import ClusterConfig
from tectonic_emu.errors import AlreadyExistsError, InvalidArgumentError, NodeUnavailableError
from tectonic_emu.nodectl import (
    ADDRESS_FILE,
    SERVE_FILE,
    STOP_MARKER,
    NodeAddress,
    control,
    is_local,
    is_served,
    node_dir,
    pid_alive,
    pid_exited,
    read_address,
    read_serve_file,
    signal_node,
    write_address,
    write_serve_file,
)
from tectonic_emu.owner import Ownership, busy_error, claim, live_holders
from tectonic_emu.secret import ensure_secret, load_secret, secret_path
from tectonic_emu.tls import server_context

log = logging.getLogger(__name__)


# -- one node process --------------------------------------------------------------------------
async def run_node(
    root: Path,
    n: int,
    *,
    host: str | None = None,
    port: int | None = None,
    delay: float = 0.0,
    buffers: int = 8,
    secret_file: Path | None = None,
    qos: str | None = None,
    metrics_port: int | None = None,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve node ``n`` of the cluster at ``root`` until SIGTERM/SIGINT (or ``stop``).
    ``host`` and ``port`` default to the node's address in the configuration (a cluster
    across hosts), else to 127.0.0.1 and any free port. ``secret_file``: the cluster secret
    (default ``root/secret``). ``qos``: "fair", "fifo" or "off" in place of the
    configuration's (``ClusterConfig.qos``). ``metrics_port``: serve the node's figures to
    Prometheus there (``qos/metrics.py``). Raises AuthenticationError when the secret is
    missing or open to others."""
    from tectonic_emu.chunkstore import LocalNode
    from tectonic_emu.chunkstore.server import NodeServer

    config = ClusterConfig.load(root)
    secret = load_secret(secret_file if secret_file is not None else secret_path(root))
    keep_freed_memory()
    if not 0 <= n < config.nodes:
        raise InvalidArgumentError(f"no node {n}; nodes are 0..{config.nodes - 1}")
    configured = config.address_of(n)
    host = host if host is not None else configured[0] if configured else "127.0.0.1"
    port = port if port is not None else configured[1] if configured else 0
    current = read_address(root, n)
    if (
        current is not None
        and current.pid != os.getpid()
        and is_local(current.hostname)
        and pid_alive(current.pid)
    ):
        raise AlreadyExistsError(f"node {n} is already served by pid {current.pid}")
    owners = [] if configured else [h for h in live_holders(root) if h.mode != "served"]
    if owners:
        raise busy_error(root, owners)  # they read and write the node directories themselves
    (node_dir(root, n) / STOP_MARKER).unlink(missing_ok=True)
    node = LocalNode(node_dir(root, n), n, config.disks_per_node, sync=config.sync)
    server = NodeServer(
        node,
        secret=secret,
        tls=server_context(root),
        max_payload=config.block_size,
        buffers=buffers,
        delay=delay,
        link=config.link,
        qos=config.node_qos(qos),
        devices=config.node_devices(n),
    )
    bound_host, bound_port = await server.start(host, port)
    if metrics_port is not None:
        from tectonic_emu.qos.metrics import serve_metrics

        serve_metrics(server.qos, n, host=host, port=metrics_port)
    advertised = socket.getfqdn() if bound_host in ("0.0.0.0", "::") else bound_host
    me = NodeAddress(n, advertised, bound_port, os.getpid(), socket.gethostname(), time.time())
    write_address(root, me)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    log.info("node %d serving on %s:%d (pid %d)", n, advertised, bound_port, os.getpid())
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        current = read_address(root, n)
        if current is not None and current.pid == os.getpid():
            (node_dir(root, n) / ADDRESS_FILE).unlink(missing_ok=True)
        await server.close()


# -- the supervisor ----------------------------------------------------------------------------
@dataclass(slots=True)
class ServeOptions:
    host: str = "127.0.0.1"
    slow: dict[int, float] = field(default_factory=dict)  # node -> reply delay in seconds
    buffers: int = 8  # chunk buffers per node process
    repair_interval: float = 10.0  # seconds between repair passes; 0 turns repair off
    repair_after: float = 30.0  # a node down this long has its chunks rebuilt elsewhere
    scrub_interval: float = 0.0  # seconds between scrub passes; 0 turns scrubbing off
    scrub_rate: float = 50e6  # bytes per second a scrub pass reads at most
    gc_grace: float = 600.0
    backup_interval: float | None = None  # seconds between metadata backups; None: config's
    qos: str | None = None  # "fair", "fifo" or "off" for every node; None: the config's
    metrics_port: int | None = None  # node n serves Prometheus at metrics_port + n


def _die_with_parent() -> None:
    """In a node process: get SIGTERM when the supervisor dies, even by SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Supervisor:
    def __init__(self, root: Path, options: ServeOptions) -> None:
        self.root = root
        self.options = options
        self.config = ClusterConfig.load(root)
        self.secret = b""  # the cluster secret, read (or made, for an older cluster) by ``run``
        self.refusals = RefusalLog(log, "control socket")
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.exits: dict[int, int] = {}  # node -> exit status of its last process
        # One start at a time per node: concurrent starts would race to serve it twice.
        self._starting: dict[int, asyncio.Lock] = {}
        self._stopping = False

    def _node_command(self, n: int) -> list[str]:
        cmd = [sys.executable, "-m", "tectonic_emu", "node", "serve", "--cluster", str(self.root)]
        cmd += ["--node", str(n)]
        if not self.config.node_addresses:  # else each binds to its configured address
            cmd += ["--host", self.options.host]
        cmd += ["--buffers", str(self.options.buffers)]
        if self.options.qos is not None:
            cmd += ["--qos", self.options.qos]
        if self.options.metrics_port is not None:
            cmd += ["--metrics-port", str(self.options.metrics_port + n)]
        if self.options.slow.get(n):
            cmd += ["--slow", f"{self.options.slow[n]}"]
        return cmd

    async def start_node(self, n: int, *, wait: float = 30.0) -> NodeAddress:
        """Start (or restart) node ``n``'s process and wait until it listens. A running
        process that serves the node is kept; one that is exiting (killed, or stopping) is
        waited for first."""
        if not 0 <= n < self.config.nodes:
            raise InvalidArgumentError(f"no node {n}; nodes are 0..{self.config.nodes - 1}")
        async with self._starting.setdefault(n, asyncio.Lock()):
            return await self._start_node(n, wait)

    async def _start_node(self, n: int, wait: float) -> NodeAddress:
        proc = self.procs.get(n)
        if proc is not None and proc.returncode is None:
            addr = read_address(self.root, n)
            if addr is not None and addr.pid == proc.pid and not pid_exited(proc.pid):
                return addr
            # Killed but not reaped yet, or stopping (it gives up its address first): a new
            # process must not share the node's directories with it.
            try:
                await asyncio.wait_for(proc.wait(), wait)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        with contextlib.suppress(FileNotFoundError):
            stale = read_address(self.root, n)
            if stale is not None and not pid_alive(stale.pid):
                (node_dir(self.root, n) / ADDRESS_FILE).unlink()
        proc = await asyncio.create_subprocess_exec(
            *self._node_command(n),
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        self.procs[n] = proc
        asyncio.get_running_loop().create_task(self._reap(n, proc))
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            addr = read_address(self.root, n)
            if addr is not None and addr.pid == proc.pid:
                return addr
            if proc.returncode is not None:
                raise NodeUnavailableError(f"node {n} exited with status {proc.returncode}")
            await asyncio.sleep(0.02)
        raise NodeUnavailableError(f"node {n} did not start listening in {wait:.0f} s")

    async def _reap(self, n: int, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        self.exits[n] = code
        if not self._stopping:
            log.warning("node %d (pid %d) exited with status %d", n, proc.pid, code)

    async def stop_nodes(self, wait: float = 10.0) -> None:
        self._stopping = True
        live = [p for p in self.procs.values() if p.returncode is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in live)), wait)
        except TimeoutError:
            for p in live:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
            await asyncio.gather(*(p.wait() for p in live))

    async def _control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One control request: the client must prove the cluster secret first (``auth.py``);
        request and reply are then one tagged message each (``nodectl.control``)."""
        peer = writer.get_extra_info("peername") or "a client"
        try:
            session = await asyncio.wait_for(
                accept_control(reader, writer, self.secret), HANDSHAKE_TIMEOUT
            )
            request = json.loads(await read_message(reader, session.receive))
        except (AuthError, TimeoutError, asyncio.IncompleteReadError, ValueError, OSError) as e:
            self.refusals.refused(peer, str(e) or type(e).__name__)
            writer.close()
            return
        try:
            if not isinstance(request, dict):
                raise ValueError(f"a request is a JSON object, not {request!r}")
            if request.get("cmd") == "start":
                addr = await self.start_node(int(request["node"]))
                reply: dict[str, Any] = {"ok": True, "address": asdict(addr)}
            elif request.get("cmd") == "status":
                reply = {
                    "ok": True,
                    "nodes": {
                        str(n): {"pid": p.pid, "running": p.returncode is None}
                        for n, p in self.procs.items()
                    },
                }
            else:
                reply = {"ok": False, "error": f"unknown request {request!r}"}
        except (ValueError, KeyError, OSError) as e:
            reply = {"ok": False, "error": str(e)}
        writer.write(pack_message(json.dumps(reply).encode(), session.send))
        with contextlib.suppress(OSError):
            await writer.drain()
            writer.close()

    async def run(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        """Own the cluster (``owner.py``), start the nodes, serve until ``stop``, then stop
        everything. Raises ClusterBusyError, naming the holder, when another process owns
        the cluster (another serve, or an embedded open)."""
        got = claim(self.root, "served")
        if not isinstance(got, Ownership):
            raise busy_error(self.root, got)
        try:
            await self._run(stop, ready)
        finally:
            got.release()  # after the nodes have stopped: they are the owner's

    async def _run(self, stop: asyncio.Event, ready: asyncio.Event | None) -> None:
        from tectonic_emu.cluster import Cluster, metadata_store
        from tectonic_emu.identity import check_store
        from tectonic_emu.services.background import repair_loop, scrub_loop
        from tectonic_emu.services.backup import backup_loop

        # Lost metadata stops serve before any node starts (Cluster.open would, after).
        await check_store(self.root, self.config, lambda: metadata_store(self.root, self.config))

        info = read_serve_file(self.root)
        if info is not None and is_local(info.get("hostname", "")) and pid_alive(int(info["pid"])):
            raise AlreadyExistsError(f"the cluster is already served by pid {info['pid']}")
        self.secret = ensure_secret(self.root)  # an older cluster gets its secret now
        control_server = await asyncio.start_server(self._control, self.options.host, 0)
        chost, cport = control_server.sockets[0].getsockname()[:2]
        write_serve_file(
            self.root,
            {
                "pid": os.getpid(),
                "control": [chost, cport],
                "hostname": socket.gethostname(),
                "started": time.time(),
            },
        )
        services: list[asyncio.Task[None]] = []
        try:
            to_start = [
                n
                for n in range(self.config.nodes)
                if not (node_dir(self.root, n) / STOP_MARKER).exists()
            ]
            await asyncio.gather(*(self.start_node(n) for n in to_start))
            async with Cluster.open(self.root) as cluster:
                opts = self.options
                if opts.repair_interval > 0:
                    services.append(
                        asyncio.create_task(
                            repair_loop(
                                cluster,
                                interval=opts.repair_interval,
                                repair_after=opts.repair_after,
                                gc_grace=opts.gc_grace,
                            )
                        )
                    )
                if opts.scrub_interval > 0:
                    services.append(
                        asyncio.create_task(
                            scrub_loop(cluster, interval=opts.scrub_interval, rate=opts.scrub_rate)
                        )
                    )
                cfg = cluster.config
                every = (
                    cfg.backup_interval if opts.backup_interval is None else opts.backup_interval
                )
                if every > 0:
                    services.append(
                        asyncio.create_task(
                            backup_loop(
                                cluster.nodes,
                                cluster.meta.kv,
                                interval=every,
                                keep=cfg.backup_keep,
                                part_size=cfg.block_size,
                                since=cfg.created,
                            )
                        )
                    )
                if ready is not None:
                    ready.set()
                await stop.wait()
                log.info("stopping: background services")
                for task in services:
                    task.cancel()
                await asyncio.gather(*services, return_exceptions=True)
                log.info("stopping: closing the cluster")
        finally:
            control_server.close()
            log.info("stopping: node processes")
            await self.stop_nodes()
            log.info("stopped")
            info = read_serve_file(self.root)
            if info is not None and info.get("pid") == os.getpid():
                (self.root / SERVE_FILE).unlink(missing_ok=True)


async def run_supervisor(root: Path, options: ServeOptions) -> None:
    """``tectonic-emu serve``: until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await Supervisor(root, options).run(stop)


def stop_supervisor(root: Path, *, wait: float = 30.0) -> int | None:
    """SIGTERM the ``tectonic-emu serve`` of the cluster at ``root`` and wait until it has
    stopped its nodes and exited. Returns its pid, or None when nothing serves it here.

    Raises NodeUnavailableError when it serves from another host or outlives ``wait``."""
    info = read_serve_file(root)
    if info is None or not pid_alive(int(info.get("pid", 0))):
        return None
    if not is_local(str(info.get("hostname", ""))):
        raise NodeUnavailableError(f"serve runs on {info['hostname']}; stop it there", str(root))
    pid = int(info["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if pid_exited(pid) or read_serve_file(root) is None:
            return pid
        time.sleep(0.05)
    raise NodeUnavailableError(f"serve (pid {pid}) did not stop in {wait:.0f} s", str(root))


# -- from Python: a supervisor in a child process ----------------------------------------------
class Serving:
    """Run ``tectonic-emu serve`` for a cluster in a child process::

    with Serving(root, repair_interval=1, repair_after=2):
        ...  # Cluster.open(root) now talks to node processes over TCP
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        wait: float = 60.0,
        log: str | os.PathLike[str] | None = None,
        detach: bool = False,
        **options: Any,
    ):
        self.root = Path(root)
        self.wait = wait
        self.log = log  # where the supervisor's and nodes' log lines go (default: stderr)
        self.detach = detach  # its own session: it outlives this process and its terminal
        self.options = options
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "tectonic_emu", "serve", "--cluster", str(self.root)]
        for key, value in self.options.items():
            if key == "slow":
                for n, delay in dict(value).items():
                    cmd += ["--slow", f"{n}={delay}"]
            else:
                cmd += [f"--{key.replace('_', '-')}", str(value)]
        return cmd

    def start(self) -> Serving:
        config = ClusterConfig.load(self.root)
        log = open(self.log, "ab") if self.log is not None else None  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=self.detach,
            )
        finally:
            if log is not None:
                log.close()
        deadline = time.monotonic() + self.wait
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise NodeUnavailableError(self._exit_reason())
            info = read_serve_file(self.root)
            if info is not None and info.get("pid") == self.proc.pid and self.ready(config):
                return self
            time.sleep(0.05)
        self.stop()
        raise NodeUnavailableError(f"serve did not start in {self.wait:.0f} s")

    def _exit_reason(self) -> str:
        """Why the supervisor exited early: its last error line, when it logged to a file."""
        said = f"serve exited with status {self.proc.returncode if self.proc else '?'}"
        if self.log is None:
            return said
        try:
            lines = Path(self.log).read_text(errors="replace").splitlines()
        except OSError:
            return said
        errors = [ln for ln in lines if "error" in ln.lower()]
        if not errors:
            return said
        return errors[-1].split("error: ", 1)[-1].strip()

    def ready(self, config: ClusterConfig) -> bool:
        for n in range(config.nodes):
            if (node_dir(self.root, n) / STOP_MARKER).exists():
                continue
            addr = read_address(self.root, n)
            if addr is None or not pid_alive(addr.pid):
                return False
        return True

    def stop(self) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> Serving:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = [
    "NodeAddress",
    "ServeOptions",
    "Serving",
    "Supervisor",
    "control",
    "is_served",
    "pid_alive",
    "pid_exited",
    "read_address",
    "run_node",
    "run_supervisor",
    "signal_node",
    "stop_supervisor",
]
