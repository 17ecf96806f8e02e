"""Arithmetic in GF(2^8) with ISA-L's polynomial (x^8+x^4+x^3+x^2+1, 0x11d), and the Cauchy
coding matrix that defines our Reed-Solomon chunk format. Only small matrices are computed here;
the bulk work is ISA-L's."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

_POLY = 0x11D


def _tables() -> tuple[list[int], list[int]]:
    exp = [0] * 510
    log = [0] * 256
    x = 1
    for i in range(255):
        exp[i] = x
        log[x] = i
        x <<= 1
        if x & 0x100:
            x ^= _POLY
    exp[255:510] = exp[0:255]
    return exp, log


_EXP, _LOG = _tables()


def gf_mul(a: int, b: int) -> int:
    if a == 0 or b == 0:
        return 0
    return _EXP[_LOG[a] + _LOG[b]]


def gf_inv(a: int) -> int:
    if a == 0:
        raise ZeroDivisionError("0 has no inverse in GF(2^8)")
    return _EXP[255 - _LOG[a]]


@cache
def cauchy_matrix(data: int, parity: int) -> tuple[tuple[int, ...], ...]:
    """The (data+parity) x data coding matrix: identity on top (systematic: data chunks are
    the block's bytes), then parity row ``i`` (``data <= i``) is ``1 / (i xor j)`` for column
    ``j``. Every ``data`` rows of it are invertible, so any ``data`` chunks decode (this is
    ISA-L's ``gf_gen_cauchy1_matrix``)."""
    if data + parity > 256:
        raise ValueError("GF(2^8) Cauchy matrices have at most 256 rows")
    rows = [tuple(int(i == j) for j in range(data)) for i in range(data)]
    rows += [tuple(gf_inv(i ^ j) for j in range(data)) for i in range(data, data + parity)]
    return tuple(rows)


def gf_matmul(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> list[list[int]]:
    """The matrix product ``a @ b`` over GF(2^8)."""
    width = len(b[0])
    result = []
    for row in a:
        acc = [0] * width
        for k, coef in enumerate(row):
            if coef:
                log_c = _LOG[coef]
                for j, value in enumerate(b[k]):
                    if value:
                        acc[j] ^= _EXP[log_c + _LOG[value]]
        result.append(acc)
    return result


__all__ = ["cauchy_matrix", "gf_inv", "gf_matmul", "gf_mul"]
