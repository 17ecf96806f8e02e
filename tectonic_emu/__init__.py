"""tectonic_emu."""
