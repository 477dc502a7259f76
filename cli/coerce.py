"""Option values converted without pydantic when they are plain (the usual case).

Typer 0.29 (the newest release) converts every option value through a pydantic
``TypeAdapter``: importing pydantic and building one adapter per option is ~0.1 s of
every command's start-up (0.09 s import + 0.02 s for the 20 adapters of ``perfmodel
plan``), a fifth of ``perfmodel capacity``. Every option of this CLI is a ``str``,
``int``, ``float``, ``bool``, ``Path`` or ``list[str]`` without
``min``/``max``/``parser``; for those, :func:`install` gives Typer a conversion that
takes the value itself when it is already of the type or is a plain literal — an ASCII
integer (``8192``, ``-3``), a decimal number (``0.5``, ``1e3``), any string, a path —
and hands every other value (`` 3 ``, ``3.0`` for an int, ``1_000``, ``inf``, a parser,
a constrained number, an enum) to Typer's own pydantic conversion, built only then. The
values taken are the ones pydantic gives (``int`` and ``float`` of an ASCII literal
parse the same in Python and in pydantic-core); a value handed over gets Typer's answer
and error, so the CLI accepts and refuses what it did before.
``tests/unit/test_cli_coerce.py`` checks both against pydantic value by value.

Typer's conversion layer is private (``typer.core._TyperParameter``,
``typer._coercion.RuntimeParam``): when it is not there — an older Typer, which converts
with Click types and imports no pydantic, or a newer one laid out otherwise —
:func:`install` does nothing and Typer converts as it would.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args, get_origin

_INT = re.compile(r"[+-]?[0-9]{1,18}")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
_UNSET = object()


def plain_value(annotation: Any, value: Any) -> Any:
    """``value`` as ``annotation`` when both are plain (see the module docstring), else
    :data:`_UNSET` (Typer's own conversion decides)."""
    if annotation is str or annotation is bool:
        return value if type(value) is annotation else _UNSET
    if annotation is int:
        if type(value) is int:
            return value
        if type(value) is str and _INT.fullmatch(value):
            return int(value)
        return _UNSET
    if annotation is float:
        if type(value) is float:
            return value
        if type(value) is int:
            return float(value)
        if type(value) is str and _FLOAT.fullmatch(value):
            return float(value)
        return _UNSET
    if get_origin(annotation) is list and get_args(annotation) == (str,):
        if isinstance(value, list | tuple) and all(type(v) is str for v in value):
            return list(value)
        return _UNSET
    return _UNSET


def _plain_info(info: Any) -> bool:
    return info.parser is None and info.min is None and info.max is None and not info.clamp


def install() -> None:
    """Let Typer convert plain option values without pydantic (idempotent; a no-op on a
    Typer without the pydantic conversion layer)."""
    try:
        from typer import _coercion, _param_types, core

        base = _coercion.RuntimeParam
        param_cls = core._TyperParameter
        build = core.build_runtime_param
        coerce_path = _param_types.coerce_cli_path
    except (ImportError, AttributeError):
        return
    if getattr(param_cls, "_perfmodel_plain", False):
        return
    original = param_cls.get_runtime_param

    class Plain(base):  # type: ignore[misc, valid-type]
        """Plain values here; any other value through Typer's conversion."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            ann = self.annotation
            if ann is Path and self.parameter_info.path_type is None:
                if type(value) is str:
                    value = Path(value)
                if isinstance(value, Path):
                    return coerce_path(
                        value, self.parameter_info, path_type=Path, param=param, ctx=ctx
                    )
            else:
                got = plain_value(ann, value)
                if got is not _UNSET:
                    return got
            full = build(param.type_descriptor)
            return full._coerce_value(value, param=param, ctx=ctx)

    def get_runtime_param(self: Any) -> Any:
        d = self.type_descriptor
        if self._runtime_param is None and d.file_annotation is None:
            ann = d.annotation
            handled = ann in (str, int, float, bool, Path) or (
                get_origin(ann) is list and get_args(ann) == (str,)
            )
            if handled and _plain_info(d.parameter_info):
                self._runtime_param = Plain(parameter_info=d.parameter_info, annotation=ann)
        return original(self)

    setattr(param_cls, "get_runtime_param", get_runtime_param)  # noqa: B010
    setattr(param_cls, "_perfmodel_plain", True)  # noqa: B010
