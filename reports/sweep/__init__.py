"""Sweeps of static-batch estimates over a grid of configurations, serial or on Dask."""
