"""Engine data files (TOML), read by ``hardware.engine``."""
