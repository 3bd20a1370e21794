"""Saving, loading and verifying a model of 1 GiB of weights stays within its memory budgets.

Each step runs in its own process (``tests/memory_steps.py``), which reads its
peak resident memory from the kernel. Budgets, above what torch alone costs for
the plain model (``torch.export.save`` and ``torch.export.load`` of its
ExportedProgram, measured here too: on a torch whose writer copies each tensor
to ``bytes`` that floor is not ours to remove):

* a save adds at most a quarter of the module's tensor bytes (the copy the
  passes work on shares every tensor; tensors are written from their memory);
* a load or a verification adds at most 1.5 times the file's size (verify's
  figure is the child process that loads the file, above its imports), or the
  floor's multiple plus a quarter where torch's own loader needs more.

The loaded programs are run and compared with the in-memory modules. About a
minute of building and writing 1 GiB files: it runs with ``--memory``, which
``.ci/run`` passes in a run of its own after the main suite.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from memory_steps import measure_in_child

pytestmark = pytest.mark.memory

LAYERS = 64  # Linear(2048, 2048) each: 1.0 GiB of fp32 weights, 64 engines
SAVE_BUDGET = 0.25  # of the module's tensor bytes, above the floor's
READ_BUDGET = 1.5  # of the file's size
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

    read_budget = max(READ_BUDGET, floors["load"] + MARGIN)
    loaded = measure_in_child("load", tmp_path, LAYERS, 2048)
    assert loaded["engine_calls"] == LAYERS and loaded["call_modules"] == 0, loaded
    assert loaded["max_abs_diff"] == 0.0, loaded
    assert loaded["peak_extra_bytes"] <= read_budget * loaded["file_bytes"], (loaded, floors)

    verified = measure_in_child("verify", tmp_path, LAYERS, 2048)  # raises unless the report is ok
    assert 0 < verified["peak_extra_bytes"] <= read_budget * verified["file_bytes"], (verified, floors)
