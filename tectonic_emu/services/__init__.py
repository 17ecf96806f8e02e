"""tectonic_emu/services."""
