"""Figures, phase-diagram sweeps and self-contained HTML reports."""
