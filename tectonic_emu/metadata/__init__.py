"""tectonic_emu/metadata."""
