"""Output types a file names that the verifying process does not import (a ``transformers`` ``ModelOutput``).

The types here are registered with torch's pytree as ``transformers`` registers its ``ModelOutput`` types (a
``dict`` subclass; values in key order, the keys as context, key paths as a dict's), under a library name no
process imports: the test process registers them (as a user's does, having imported the library), and the
commands' children, which never import it, rebuild them from the file. ``verify``, ``inspect`` and ``diff`` then
work from the command line, values paired field by field by name; ``trt_inline.load`` in a process without the
library says in one line which type it lacks and what to do; a type whose context is not a list of field names
cannot be rebuilt, and says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from support.commands import cli
from support.processes import new_interpreter, python_path
from torch import nn
from torch.utils import _pytree as pytree

import trt_inline

LIBRARY = "fakelib.modeling_outputs"


class BaseModelOutput(dict[str, Any]):
    """What ``transformers`` returns: fields by name, in the order the model set them."""

    def __getattr__(self, name: str) -> Any:
        return self[name]


BaseModelOutput.__module__ = LIBRARY


class Opaque:
    """A registered type whose context says nothing of its fields."""

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


Opaque.__module__ = LIBRARY


def _register() -> None:
    name = f"{LIBRARY}.BaseModelOutput"
    if name in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE:
        return
    pytree.register_pytree_node(
        BaseModelOutput,
        lambda out: (list(out.values()), list(out.keys())),
        lambda values, keys: BaseModelOutput(zip(keys, values, strict=True)),
        serialized_type_name=name,
        flatten_with_keys_fn=pytree._dict_flatten_with_keys,  # type: ignore[arg-type]
    )
    pytree.register_pytree_node(
        Opaque,
        lambda out: ([out.value], None),
        lambda values, _: Opaque(values[0]),
        serialized_type_name=f"{LIBRARY}.Opaque",
        flatten_with_keys_fn=lambda out: ([(pytree.GetAttrKey("value"), out.value)], None),
    )


class Encoder(nn.Module):
    def __init__(self, pooled_first: bool = False) -> None:
        super().__init__()
        self.body, self.pool = nn.Linear(8, 8), nn.Linear(8, 4)
        self.pooled_first = pooled_first

    def forward(self, x: torch.Tensor) -> BaseModelOutput:
        hidden = torch.tanh(self.body(x))
        pooled = self.pool(hidden.mean(1))
        if self.pooled_first:
            return BaseModelOutput(pooler_output=pooled, last_hidden_state=hidden)
        return BaseModelOutput(last_hidden_state=hidden, pooler_output=pooled)


class OpaqueModel(nn.Module):
    def forward(self, x: torch.Tensor) -> Opaque:
        return Opaque(x + 1)


@pytest.fixture(scope="module")
def saves(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    _register()
    root = tmp_path_factory.mktemp("output_types")
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    model = Encoder().eval()
    files = {name: root / f"{name}.pt2" for name in ("a", "b", "reordered", "opaque")}
    for name in ("a", "b"):
        trt_inline.save(trt_inline.reference.compile(model, (x,)), files[name], arg_inputs=[x])
    swapped = Encoder(pooled_first=True).eval()
    swapped.load_state_dict(model.state_dict())
    trt_inline.save(trt_inline.reference.compile(swapped, (x,)), files["reordered"], arg_inputs=[x])
    trt_inline.save(torch.export.export(OpaqueModel(), (x,)), files["opaque"], arg_inputs=[x])
    # The structure under test: the file names the type by name, with its fields as the context.
    out = torch.export.load(files["a"]).module()(x)
    assert type(out) is BaseModelOutput and list(out) == ["last_hidden_state", "pooler_output"]
    return files


def test_verify_inspect_and_diff_read_the_type_as_data(saves: dict[str, Path]) -> None:
    proc = cli("verify", str(saves["a"]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fakelib" not in proc.stderr
    assert f"output types rebuilt from the file as data, their fields compared by name (the library that defines " \
           f"them was not imported): {LIBRARY}.BaseModelOutput" in proc.stdout, proc.stdout  # fmt: skip
    proc = cli("verify", str(saves["a"]), "--json")
    outputs = json.loads(proc.stdout)["outputs"]
    assert [o["shape"] for o in outputs] == [[2, 5, 8], [2, 4]], outputs
    proc = cli("inspect", str(saves["a"]))
    assert proc.returncode == 0 and "out['last_hidden_state']" in proc.stdout, proc.stdout + proc.stderr
    proc = cli("diff", str(saves["a"]), str(saves["b"]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The same fields in another order: paired by name (a caller reads out.pooler_output), the order named.
    proc = cli("diff", str(saves["reordered"]), str(saves["a"]))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "out['last_hidden_state'] is output 1 of the program and output 0 of a.pt2" in proc.stdout, proc.stdout


@pytest.mark.heavy
def test_the_child_never_imports_the_library(saves: dict[str, Path], tmp_path: Path) -> None:
    """The commands as processes of their own, with a library of that name on the path that would say so if
    imported."""
    library = tmp_path / "fakelib"
    library.mkdir()
    marker = tmp_path / "imported"
    (library / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (library / "modeling_outputs.py").write_text("")
    env = {"PYTHONPATH": f"{tmp_path}:{python_path()}"}
    for args in (("verify", str(saves["a"])), ("diff", str(saves["a"]), str(saves["b"]))):
        proc = cli(*args, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not marker.exists()


def test_a_process_without_the_library_is_told_which_type_and_what_to_do(saves: dict[str, Path]) -> None:
    code = (
        "import sys, trt_inline\n"
        "try:\n    trt_inline.load(sys.argv[1])\nexcept trt_inline.errors.LoadError as exc:\n    print(exc)\n"
    )
    proc = new_interpreter("-c", code, str(saves["a"]), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"names the type {LIBRARY}.BaseModelOutput, which torch's pytree does not know in this process" in (
        proc.stdout
    ), proc.stdout
    assert "import the library that defines it (fakelib)" in proc.stdout, proc.stdout


def test_a_type_whose_context_names_no_fields_is_one_line(saves: dict[str, Path]) -> None:
    proc = cli("verify", str(saves["opaque"]))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and f"names the type {LIBRARY}.Opaque, whose context (null) is not one field name" in (
        line
    ), line
    assert "load the file in a process that imports fakelib" in line, line
