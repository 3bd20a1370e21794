"""A user's script as ``trt-inline fix SCRIPT`` reads it: the model, its example inputs, its compile settings.

The script is the user's own, run in this process as ``python SCRIPT`` would run it, but under the name
``__trt_inline_fix__`` (its ``if __name__ == "__main__":`` block does not run), with its folder first on
``sys.path`` while it runs. It defines either

* ``model()``, a function of no arguments returning ``(module, arg_inputs)``, or
* ``model``, the ``nn.Module``, and ``arg_inputs``, its example inputs (a tuple or list; one tensor alone is
  taken as the one input),

and optionally ``settings``, a dict of the compile settings (``{"enable_autocast": True}``). ``--settings
JSON`` is read by :func:`settings_from_json`: a JSON object whose precisions are named (``"float16"``), merged
over the script's; with neither, :func:`default_settings`.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trt_inline.errors import first_line, printable
from trt_inline.fixing.fix_report import FixError

__all__ = ["RUN_NAME", "ScriptModel", "default_settings", "load_script", "settings_from_json"]

RUN_NAME = "__trt_inline_fix__"
# The settings whose values are precisions (torch dtypes), which JSON names.
_PRECISION_LISTS = ("enabled_precisions",)
_PRECISION_VALUES = ("autocast_low_precision_type",)


@dataclass
class ScriptModel:
    """What a script defines: the model, its example inputs, and its settings (empty where it gives none)."""

    module: torch.nn.Module
    arg_inputs: tuple[Any, ...]
    settings: dict[str, Any] = field(default_factory=dict)


def load_script(path: str | os.PathLike[str]) -> ScriptModel:
    """Run the script at ``path`` and take its model, inputs and settings; :class:`FixError` naming the script
    where it is missing, raises, or defines neither form."""
    where = printable(os.fspath(path))
    if not os.path.exists(path):
        raise FixError(f"script {where}: no such file")
    if os.path.isdir(path):
        raise FixError(f"script {where}: is a directory, not a Python script")
    folder = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, folder)
    try:
        names = runpy.run_path(os.fspath(path), run_name=RUN_NAME)
        module, arg_inputs = _model(names, where)
    except FixError:
        raise
    except (Exception, SystemExit) as exc:
        raise FixError(f"script {where} raised {type(exc).__name__}: {first_line(exc)}") from exc
    finally:
        sys.path.remove(folder)
    settings = names.get("settings", {})
    if not isinstance(settings, Mapping):
        raise FixError(f"script {where}: settings is a {type(settings).__name__}, not a dict of compile settings")
    return ScriptModel(module, arg_inputs, dict(settings))


def _model(names: Mapping[str, Any], where: str) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    given = names.get("model")
    if isinstance(given, torch.nn.Module):
        if "arg_inputs" not in names:
            raise FixError(f"script {where} defines model but not arg_inputs (its example inputs, a tuple)")
        return given, _inputs(names["arg_inputs"], where, "arg_inputs")
    if callable(given):
        made = given()
        if not (isinstance(made, Sequence) and len(made) == 2 and isinstance(made[0], torch.nn.Module)):
            raise FixError(f"script {where}: model() returns {type(made).__name__}, not (module, arg_inputs)")
        return made[0], _inputs(made[1], where, "model()'s arg_inputs")
    raise FixError(
        f"script {where} defines no model: define model() returning (module, arg_inputs), or model (an nn.Module) "
        "and arg_inputs"
    )


def _inputs(value: Any, where: str, what: str) -> tuple[Any, ...]:
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (tuple, list)):
        return tuple(value)
    raise FixError(f"script {where}: {what} is a {type(value).__name__}, not a tuple of inputs")


def default_settings(strategy: str | None = None) -> dict[str, Any]:
    """The settings where neither the script nor ``--settings`` gives any: an fp16 build of the release rehearsed
    here (:func:`~trt_inline.reference.release.rehearsed_release`), in its names: ``enable_autocast=True,
    autocast_low_precision_type=torch.float16`` where it has autocast (2.10+: ``enable_autocast`` alone is fp32),
    ``enabled_precisions={torch.float16}`` before. (Either strategy searches the same build.)"""
    from trt_inline.reference.release import rehearsed_release

    record = rehearsed_release()
    if record is None or record.autocast:
        return {"enable_autocast": True, "autocast_low_precision_type": torch.float16}
    return {"enabled_precisions": {torch.float16}}


def settings_from_json(text: str) -> dict[str, Any]:
    """``--settings JSON``: a JSON object of compile settings, each precision named as torch names it
    (``"float16"`` or ``"torch.float16"``); ``enabled_precisions`` becomes a set."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FixError(f"--settings {printable(text[:80])}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise FixError(f"--settings: a JSON object of compile settings, got {type(value).__name__}")
    for key in _PRECISION_LISTS:
        if key in value:
            if not isinstance(value[key], list):
                raise FixError(f'--settings: {key} is a list of precisions (["float16"]), got {value[key]!r}')
            value[key] = {_dtype(item, key) for item in value[key]}
    for key in _PRECISION_VALUES:
        if key in value:
            value[key] = _dtype(value[key], key)
    return value


def _dtype(name: Any, key: str) -> torch.dtype:
    found = getattr(torch, name.removeprefix("torch."), None) if isinstance(name, str) else None
    if not isinstance(found, torch.dtype):
        raise FixError(f"--settings: {key}: {name!r} is not a precision (float16, bfloat16, float32)")
    return found
