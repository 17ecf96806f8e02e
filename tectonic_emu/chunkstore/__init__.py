"""tectonic_emu/chunkstore."""
