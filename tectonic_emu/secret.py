"""The cluster secret: 32 random bytes that every node, client and supervisor of a served
cluster proves it knows on every connection (``chunkstore/auth.py``, ``docs/deploy.md``).

It lives in ``DIR/secret`` as 64 hex digits and a newline, mode 0600, in a cluster directory
of mode 0700: only the cluster's owner (and root) can read it. ``cluster create`` makes it; a
cluster made before secrets existed gets one from its first ``tectonic-emu serve``. A node on
another host reads its copy from the path given to ``node serve --secret``.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from tectonic_emu.chunkstore.auth import SECRET_BYTES, random_secret
from tectonic_emu.errors import AuthenticationError

SECRET_FILE = "secret"


def secret_path(root: Path) -> Path:
    return Path(root) / SECRET_FILE


def create_secret(path: Path) -> bytes:
    """Write a new random secret to ``path``, which must not exist (0600, fsync'd); returns it.
    Raises FileExistsError when it does (another process may just have made it)."""
    secret = random_secret()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, secret.hex().encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    return secret


def load_secret(path: Path) -> bytes:
    """The secret in ``path``. Raises AuthenticationError, naming the fix, when it is missing,
    not a regular file, readable or writable by group or others, or not 64 hex digits."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise AuthenticationError(
            "no cluster secret here: `cluster create` makes one, the first `serve` of an older "
            "cluster too; on another host copy the cluster's `secret` file (mode 0600) and pass "
            "--secret FILE",
            str(path),
        ) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise AuthenticationError("the cluster secret is a symlink", str(path)) from None
        raise AuthenticationError(
            f"cannot read the cluster secret ({e.strerror})", str(path)
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise AuthenticationError("the cluster secret is not a regular file", str(path))
        if st.st_mode & 0o077:
            raise AuthenticationError(
                f"the cluster secret is open to others (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"chmod 600 it",
                str(path),
            )
        raw = os.read(fd, 4 * SECRET_BYTES)
    finally:
        os.close(fd)
    try:
        secret = bytes.fromhex(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        secret = b""
    if len(secret) != SECRET_BYTES:
        raise AuthenticationError(
            f"not a cluster secret ({2 * SECRET_BYTES} hex digits expected)", str(path)
        )
    return secret


def ensure_secret(root: Path) -> bytes:
    """The secret of the cluster at ``root``, made now when it has none (a cluster from before
    secrets). Two processes making it at once agree: the second reads the first's."""
    path = secret_path(root)
    try:
        return load_secret(path)
    except AuthenticationError:
        if path.exists() or path.is_symlink():
            raise
    try:
        return create_secret(path)
    except FileExistsError:
        return load_secret(path)


__all__ = ["SECRET_FILE", "create_secret", "ensure_secret", "load_secret", "secret_path"]
