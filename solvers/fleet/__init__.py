"""Fleet provisioning: the least-cost mix of device types, configurations and roles."""
