"""Optimization models and heuristics: expert dispatch and placement, PD ratio, cache budget."""
