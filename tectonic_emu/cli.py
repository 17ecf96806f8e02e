"""Placeholder replaced below."""


def main() -> None:
    pass
