"""The ``tectonic-emu bench`` command group (filled in by bench/store.py)."""

import click


@click.group()
def bench() -> None:
    """Throughput benchmarks, each figure beside this machine's limit."""
