"""Saving, loading and verifying a model of 1 GiB of weights stays within its memory budgets.

Each step runs in its own process (``tests/support/memory_steps.py``), which reads its
peak resident memory from the kernel. Budgets, above what torch alone costs for
the plain model (``torch.export.save`` and ``torch.export.load`` of its
ExportedProgram, measured here too: on a torch whose writer copies each tensor
to ``bytes`` that floor is not ours to remove):

* a save adds at most a quarter of the module's tensor bytes (the copy the
  passes work on shares every tensor; tensors are written from their memory);
* ``trt_inline.load`` and one forward, ``verify`` and ``verify --per-engine``
  (the child process that opens the file, above its imports) hold at most a
  quarter of the file's size in anonymous memory: the weights are mapped from
  the file (file-backed pages), not read into the process;
* ``inspect`` holds at most 64 MiB above its imports: it reads no weight;
* ``torch.export.load`` of the same file (what a user gets without trt-inline)
  is measured beside, within the floor's multiple plus a quarter.

The loaded programs are run and compared with the in-memory modules. About a
minute of building and writing 1 GiB files: it runs with ``--memory``, which
``.ci/run`` passes in a run of its own after the main suite.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.memory_steps import measure_in_child

pytestmark = pytest.mark.memory

LAYERS = 64  # Linear(2048, 2048) each: 1.0 GiB of fp32 weights, 64 engines
SAVE_BUDGET = 0.25  # of the module's tensor bytes, above the floor's
ANONYMOUS_BUDGET = 0.25  # of the file's size: the weights are mapped
INSPECT_BUDGET = 64 << 20
MARGIN = 0.25


@pytest.fixture(scope="module")
def floors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What torch's own save and load of the plain model's ExportedProgram cost."""
    folder = tmp_path_factory.mktemp("floor")
    saved = measure_in_child("floor", folder, LAYERS, 2048)
    loaded = measure_in_child("load-floor", folder, LAYERS, 2048)
    assert loaded["max_abs_diff"] == 0.0, loaded
    return {
        "save": saved["peak_extra_bytes"] / saved["tensor_bytes"],
        "load": loaded["peak_extra_bytes"] / loaded["file_bytes"],
    }


@pytest.mark.parametrize("save_step", ["save", "save-no-retrace"])
def test_one_gib_model_within_the_memory_budgets(tmp_path: Path, save_step: str, floors: dict[str, Any]) -> None:
    saved = measure_in_child(save_step, tmp_path, LAYERS, 2048)
    assert saved["tensor_bytes"] >= 1 << 30
    assert saved["peak_extra_bytes"] <= (floors["save"] + SAVE_BUDGET) * saved["tensor_bytes"], (saved, floors)

    loaded = measure_in_child("load", tmp_path, LAYERS, 2048)
    assert loaded["engine_calls"] == LAYERS and loaded["call_modules"] == 0, loaded
    assert loaded["max_abs_diff"] == 0.0, loaded
    assert loaded["peak_anonymous_bytes"] <= ANONYMOUS_BUDGET * loaded["file_bytes"], loaded
    assert loaded["peak_file_bytes"] >= 0.5 * loaded["file_bytes"], ("the weights are file-backed", loaded)

    stock = measure_in_child("load-stock", tmp_path, LAYERS, 2048)
    assert stock["max_abs_diff"] == 0.0, stock
    assert stock["peak_extra_bytes"] <= (floors["load"] + MARGIN) * stock["file_bytes"], (stock, floors)

    for step in ("verify", "verify-per-engine"):
        verified = measure_in_child(step, tmp_path, LAYERS, 2048)  # raises unless the report is ok
        assert 0 < verified["peak_anonymous_bytes"] <= ANONYMOUS_BUDGET * verified["file_bytes"], verified
        assert verified["peak_file_bytes"] >= 0.5 * verified["file_bytes"], ("the weights are file-backed", verified)

    inspected = measure_in_child("inspect", tmp_path, LAYERS, 2048)
    assert inspected["peak_extra_bytes"] <= INSPECT_BUDGET, inspected
