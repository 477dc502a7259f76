"""The ``perfmodel`` command line (Typer): parse, call, render."""
