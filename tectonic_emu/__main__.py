"""``python -m tectonic_emu`` is the ``tectonic-emu`` command."""

from tectonic_emu.cli import main

main()
