"""Saving, loading and verifying a model of 1 GiB of weights stays within its memory budgets.

Each step runs in its own process (``tests/memory_steps.py``), which reads its
peak resident memory from the kernel: a save may add at most a quarter of the
module's tensor bytes (the copy the passes work on shares every tensor; tensors
are written from their own memory), a load or a verification at most 1.5 times
the file's size (verify's own figure is the child process that loads the file).
The loaded program is run and compared with the in-memory module.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from memory_steps import measure_in_child

LAYERS = 64  # Linear(2048, 2048) each: 1.0 GiB of fp32 weights, 64 engines
SAVE_BUDGET = 0.25  # of the module's tensor bytes
READ_BUDGET = 1.5  # of the file's size


@pytest.mark.parametrize("save_step", ["save", "save-no-retrace"])
def test_one_gib_model_within_the_memory_budgets(tmp_path: Path, save_step: str) -> None:
    saved = measure_in_child(save_step, tmp_path, LAYERS, 2048)
    assert saved["tensor_bytes"] >= 1 << 30
    assert saved["peak_extra_bytes"] <= SAVE_BUDGET * saved["tensor_bytes"], saved

    loaded = measure_in_child("load", tmp_path, LAYERS, 2048)
    assert loaded["engine_calls"] == LAYERS and loaded["call_modules"] == 0, loaded
    assert loaded["max_abs_diff"] == 0.0, loaded
    assert loaded["peak_extra_bytes"] <= READ_BUDGET * loaded["file_bytes"], loaded

    verified = measure_in_child("verify", tmp_path, LAYERS, 2048)  # raises unless the report is ok
    assert 0 < verified["peak_extra_bytes"] <= READ_BUDGET * verified["file_bytes"], verified
