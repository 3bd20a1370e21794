"""The canonical program: everything torch is given of a file from a stranger, written or checked by trt-inline.

Wall one of verification (README, "Threat model"): torch never reads the
stranger's archive. The strict reader (:mod:`trt_inline.archive.reader`) checks
it and keeps what it checked; this module turns that into a fresh archive in the
current layout and loads it through the current layout's deserializer
(:func:`trt_inline.compat.deserialize_program`: ``ExportedProgramDeserializer``,
the step ``torch.export.load`` ends in), never through ``torch.export.load``
itself, whose fallbacks read older layouts:

==========================  ====================================================  ======================
part of the archive          what it is                                            bytes written by
==========================  ====================================================  ======================
``models/model.json``       the program document, rebuilt field by field           trt-inline
                            (:func:`~trt_inline.archive.program_checks.canonical_document`)
``data/weights/<name>``,    each tensor as its checked payload config declares     the file (raw tensor
``data/constants/<name>``   it: a view of the original file at the checked          data, never parsed)
                            offset, mapped, never copied
``data/sample_inputs``      tensors read by :mod:`~trt_inline.archive.pickles`      trt-inline
``extra/<name>``            trt-inline's own extra files, as text                  the file (checked
                                                                                    where decoded)
==========================  ====================================================  ======================

Whatever else the original file holds is not in the canonical archive and so
cannot reach torch. :meth:`Canonical.entries` lists what it holds (what tests
compare against the original's entries). Payloads the user let through
(``--allow-pickle``, ``--allow-native-code``) are the one exception: their bytes
go to torch as they are, and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import ExportedProgram

from trt_inline import compat, progress
from trt_inline.archive import program_checks
from trt_inline.archive.output_types import prepare_output_types, spec_types
from trt_inline.archive.reader import Bases, Contents, TensorRecord, passthrough_loader
from trt_inline.errors import VerifyInputError, first_line
from trt_inline.formats import format_size

__all__ = ["Canonical", "canonical_archive"]


@dataclass
class Canonical:
    """The canonical archive of one file (see the module's table); :meth:`load` gives the ExportedProgram."""

    source: str
    document: bytes
    weights: dict[str, Any]
    constants: dict[str, Any]
    sample_inputs: tuple[Any, ...] | None
    extra: list[str] = field(default_factory=list)
    # Whole torch.save blobs the user allowed to reach torch as they are (torch 2.5 ... 2.8 weight files).
    blobs: dict[str, bytes] = field(default_factory=dict)
    # The pytree types its call specs name, with their contexts (:func:`~trt_inline.archive.output_types.spec_types`).
    spec_types: list[tuple[str, Any, int]] = field(default_factory=list)

    def entries(self) -> list[str]:
        """The parts of the archive, named as the current layout names them."""
        names = ["models/model.json"]
        names += [f"data/weights/{name}" for name in self.weights]
        names += [f"data/constants/{name}" for name in self.constants]
        names += [f"data/pickled/{kind}" for kind in self.blobs]
        names += ["data/sample_inputs/model.pt"] if self.sample_inputs is not None else []
        return names + [f"extra/{name}" for name in self.extra]

    def load(self, *, weights: bool = True) -> ExportedProgram:
        """The ExportedProgram torch deserializes from this archive; ``weights=False``: tensors on the meta device.

        Raises :class:`VerifyInputError` naming the file when torch cannot build it.
        """
        bases: Bases = {}
        records = [v for v in (*self.weights.values(), *self.constants.values()) if isinstance(v, TensorRecord)]
        size = format_size(sum({(id(r.view), r.offset): r.nbytes for r in records}.values()))  # aliases once
        progress.report(
            f"building its program: {len(records)} tensors, {size} mapped"
            if weights
            else f"building its program without weights ({len(records)} tensors, {size} not read)"
        )
        try:
            state_dict: Any = self.blobs.get("weights") or {
                name: _materialize(value, bases, weights) for name, value in self.weights.items()
            }
            constants: Any = self.blobs.get("constants") or {
                name: _materialize(value, bases, weights) for name, value in self.constants.items()
            }
            prepare_output_types(self.spec_types, self.source)
            return compat.deserialize_program(self.document, state_dict, constants, self.sample_inputs)
        except RecursionError:
            raise VerifyInputError(f"{self.source}: nested too deeply to be read") from None
        except VerifyInputError:
            raise
        except Exception as exc:
            raise VerifyInputError(
                f"{self.source}: torch {torch.__version__} cannot build its program ({type(exc).__name__}: "
                f"{first_line(exc)})"
            ) from exc


def _materialize(value: Any, bases: Bases, weights: bool) -> Any:
    if isinstance(value, TensorRecord):
        return value.tensor(bases, meta=not weights)
    load = passthrough_loader(value)
    if load is not None:
        return load()
    if not weights and isinstance(value, torch.Tensor):
        meta = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        return torch.nn.Parameter(meta, value.requires_grad) if isinstance(value, torch.nn.Parameter) else meta
    return value


def canonical_archive(contents: Contents) -> Canonical:
    """The canonical archive of what the strict reader checked in one file."""
    if contents.document is None:
        raise VerifyInputError(f"{contents.path}: holds no program to load")
    if contents.as_data:  # (a document kept as parsed, not rebuilt: never handed to torch)
        raise AssertionError(f"{contents.path}: read to be described only, and never loaded")
    return Canonical(
        str(contents.path),
        program_checks.canonical_bytes(contents.document),
        dict(contents.weights),
        dict(contents.constants),
        contents.sample_inputs,
        sorted(contents.extra),
        dict(contents.blobs),
        spec_types(contents.document),
    )
