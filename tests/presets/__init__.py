"""The shipped presets (presets/*.yaml) against the behaviour each was chosen for."""
