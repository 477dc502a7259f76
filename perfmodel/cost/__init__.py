"""Money and energy: device prices (catalog, overridable) and a utilization power model."""
