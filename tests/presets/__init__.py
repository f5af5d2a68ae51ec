"""The shipped presets (cg/presets/*.yaml) against the behaviour each was chosen for."""
