"""The manifest's text (clients/ckpt_format.py): entries written by hand are exactly what
the JSON encoder writes, and read back equal."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from clients.ckpt_format import Entry, Manifest, Part, Shard, entry_text, rank_error

ints = st.integers(min_value=0, max_value=2**63 - 1)
names = st.text(min_size=1, max_size=20)  # quotes, control characters, non-ASCII
shapes = st.lists(ints, max_size=4).map(tuple)
parts = st.builds(Part, names, ints, ints, st.integers(0, 2**32 - 1), ints, ints, st.none() | names)
entries = st.builds(
    Entry,
    ints,
    names,
    st.sampled_from(["shard", "array", "bytes"]),
    st.sampled_from(["", "<f4", "|u1", "<f2"]),
    shapes,
    shapes,
    shapes,
    st.lists(parts, max_size=3).map(tuple),
)


@given(entries)
def test_an_entrys_text_is_the_encoders_and_reads_back_equal(e: Entry) -> None:
    text = entry_text(e)
    assert text == json.dumps(e.to_json(), separators=(",", ":"))
    assert entry_text(e.to_json()) == text
    assert Entry.from_json(json.loads(text)) == e


@given(st.lists(entries, max_size=5).map(tuple), st.integers(0, 10**6), ints)
def test_a_manifest_reads_back_equal(es: tuple[Entry, ...], step: int, world: int) -> None:
    m = Manifest(step, world, es, 12.5)
    assert Manifest.decode(m.encode(), "m") == m
    assert Manifest.decode(m.encode([entry_text(e) for e in es]), "m") == m


def test_a_shard_takes_numpy_integers_and_stores_ints() -> None:
    s = Shard(np.zeros((2, 3)), (np.int64(4), np.int32(3)), (np.int64(2), 0))
    assert s.global_shape == (4, 3) and s.offset == (2, 0)
    assert all(type(x) is int for x in (*s.global_shape, *s.offset))


@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from("abcdefg")).map(
            lambda rn: Entry(rn[0], rn[1], "bytes")
        ),
        max_size=30,
    )
)
def test_each_ranks_names_are_those_it_saved_in_the_manifests_order(es: list[Entry]) -> None:
    """``Index.names_of`` (what a load at the saved world size walks) is, for every rank,
    the names of ``by_name`` that the rank has an entry for, in that order, each once."""
    from clients.ckpt_catalog import Index

    ix = Index(Manifest(1, 6, tuple(es)))
    for rank in range(7):
        assert ix.names_of(rank) == [n for n in ix.by_name if (n, rank) in ix.own]


@given(st.one_of(st.text(), st.floats(allow_nan=True), st.integers(), st.booleans()))
def test_a_rank_refused_is_named_in_one_line(rank: object) -> None:
    """Whatever a caller passes as a rank, its error is one line (docs/errors.md): a text
    rank of "\\n" once printed a line break (found by tests/test_api_types.py)."""
    err = rank_error(rank, 4)
    if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 4:
        assert err is None
        return
    assert err is not None and "\n" not in str(err) and "is not in [0, 4)" in str(err)
