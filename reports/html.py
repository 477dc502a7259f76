"""A figure as a self-contained HTML page: plotly.js inlined, so it opens offline."""

from __future__ import annotations

from typing import Any


def figure_html(fig: Any) -> str:
    """The whole page of ``fig`` (a plotly figure) with plotly.js embedded."""
    return str(fig.to_html(include_plotlyjs=True, full_html=True))
