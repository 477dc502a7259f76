"""Hardware: device specs (data files in ``catalog/``) and cost profiles."""
