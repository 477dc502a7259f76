"""Private helpers of ``perfmodel.model``: per-layer structure and config parsing.

``perfmodel.model`` is the public face (``ModelSpec``, ``load_model``); this package
holds what would make that module too long: the layer descriptors and their parameter
and cache formulas (``layers``), and reading Hugging Face ``config.json`` files with
their many family dialects (``parse``, ``patterns``, ``quant``).
"""
