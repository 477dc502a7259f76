"""perfmodel: analytical performance modeling and capacity planning for LLM serving.

Kept deliberately light: importing :mod:`perfmodel` pulls in nothing but the
base modules' names, so ``hardware`` can use ``perfmodel.units`` without a cycle.
"""

__version__ = "0.1.0"
