"""Ad hoc, for docs/performance.md (*Authentication*): the CPU time a process spends in
authentication itself. Put this directory first on PYTHONPATH and set AUTHTIME_DIR: every
Python process started so (a client, the supervisor, each node) then times
``FrameMac.tag`` (which ``check`` calls) and the handshake steps with ``time.thread_time``,
and writes ``calls seconds`` to ``$AUTHTIME_DIR/<pid>`` every 16 calls and at exit.
``bench/served_cpu.py`` adds the sum over processes to each phase when AUTHTIME_DIR is set::

    AUTHTIME_DIR=$(mktemp -d) PYTHONPATH=bench/authtime:. python bench/served_cpu.py 536870912 r3
"""

import os
import time

_dir = os.environ.get("AUTHTIME_DIR")
if _dir:
    import atexit

    from tectonic_emu.chunkstore import auth

    _state = {"calls": 0, "cpu": 0.0}

    def _dump() -> None:
        with open(os.path.join(_dir, str(os.getpid())), "w") as f:
            f.write(f"{_state['calls']} {_state['cpu']:.6f}\n")

    def _timed(fn):  # type: ignore[no-untyped-def]
        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            t = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                _state["cpu"] += time.thread_time() - t
                _state["calls"] += 1
                if _state["calls"] % 16 == 0:
                    _dump()

        return timed

    auth.FrameMac.tag = _timed(auth.FrameMac.tag)  # type: ignore[method-assign]
    for cls, name in (
        (auth.ClientHandshake, "answer"),
        (auth.ServerHandshake, "challenge"),
        (auth.ServerHandshake, "verify"),
    ):
        setattr(cls, name, _timed(getattr(cls, name)))
    atexit.register(_dump)
