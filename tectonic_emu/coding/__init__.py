"""tectonic_emu/coding."""
