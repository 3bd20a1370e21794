"""Names a person knows: engines, fallback regions and nodes named by module path, class and source line.

A nested model (two ``Block``s of ``Linear``, ``ReLU``, ``Linear`` in a ``Sequential``, the relu left to
PyTorch) is compiled by the reference backend and saved with boundary data; one weight of the middle engine
(``stages.0.proj`` and ``stages.1.fc``) is then moved in the saved payload. ``verify --per-engine`` (text,
``--json``, ``--junit``), ``diff``, ``inspect`` and the ``--extract`` repro name that engine by the modules its
steps come from and their source lines in this file. The same model compiled from a program stripped of
``nn_module_stack`` and ``stack_trace`` says once that nothing it names is recorded. A file's node metadata
is read as data by the strict reader (torch never gets it) and names the ops left to PyTorch; crafted
metadata names nothing it should not.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from support.commands import cli
from support.hostile import reference_io_text
from support.programs import engine_calls, engine_label
from torch import nn

import trt_inline
from trt_inline.archive import REFERENCE_IO_FILE, decode_reference_io
from trt_inline.module_paths import NOT_RECORDED, NodeOrigin, covered, node_origin
from trt_inline.verify.boundaries import trace_program
from trt_inline.verify.compare import Criteria
from trt_inline.verify.localize import Reference, localize

HERE = Path(__file__)
MIDDLE = ["stages.0.proj (Linear)", "stages.1.fc (Linear)"]  # what engine 1 covers


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.act, self.proj = nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h = self.act(h)
        return self.proj(h)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stages = nn.Sequential(Block(), Block())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(x)


def _line(code: str) -> str:
    """``test_module_paths.py:41 in forward: h = self.fc(x)``: the line of ``code`` in this file, found by its text."""
    numbers = [i for i, line in enumerate(HERE.read_text().splitlines(), 1) if line.strip() == code]
    assert len(numbers) == 1, (code, numbers)
    return f"{HERE.name}:{numbers[0]} in forward: {code}"


@dataclass
class Saved:
    x: torch.Tensor
    good: Path
    fault: Path  # engine 1's first weight moved
    bare_fault: Path  # the same, compiled from a program without module stacks and stack traces
    labels: list[str]  # each engine's submodule name


def _steps(program: torch.export.ExportedProgram, engine: int) -> list[dict[str, object]]:
    steps: list[dict[str, object]] = json.loads(engine_calls(program)[engine].args[2])["steps"]
    return steps


def _engine_fault(good: Path, target: Path, engine: int) -> Path:
    """``good`` with the first weight tensor of one engine's payload moved by 0.05, its boundary data kept."""
    program = torch.export.load(good)
    node = engine_calls(program)[engine]
    weight = json.loads(node.args[2])["weights"][0]
    constant = next(s.target for s in program.graph_signature.input_specs if s.arg.name == node.args[1].name)
    program.constants[constant][weight["offset"] : weight["offset"] + weight["nbytes"]].view(torch.float32).add_(0.05)
    torch.export.save(program, target, extra_files={REFERENCE_IO_FILE: reference_io_text(good)})
    return target


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Saved:
    root = tmp_path_factory.mktemp("module_paths")
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    model = Net().eval()
    compiled = trt_inline.reference.compile(model, (x,), torch_executed_ops=["aten.relu.default"])
    good = root / "good.pt2"
    trt_inline.save(compiled, good, arg_inputs=[x], embed_reference="boundaries")
    stripped = torch.export.export(model, (x,))
    for node in stripped.graph.nodes:
        node.meta.pop("nn_module_stack", None)
        node.meta.pop("stack_trace", None)
    bare = root / "bare.pt2"
    compiled_bare = trt_inline.reference.compile(stripped, (x,), torch_executed_ops=["aten.relu.default"])
    trt_inline.save(compiled_bare, bare, arg_inputs=[x], embed_reference="boundaries")
    # Structure first: three engines; the middle one's steps come from the second Linear of the first block
    # and the first Linear of the second; the stripped build's steps record nothing.
    program = torch.export.load(good)
    assert len(engine_calls(program)) == 3
    assert [o.module for o in _origins(_steps(program, 1))] == [MIDDLE[0]] * 2 + [MIDDLE[1]] * 2
    bare_program = torch.export.load(bare)
    assert len(engine_calls(bare_program)) == 3
    assert all("origin" not in step for engine in range(3) for step in _steps(bare_program, engine))
    labels = [engine_label(program, index) for index in range(3)]
    return Saved(
        x, good, _engine_fault(good, root / "fault.pt2", 1), _engine_fault(bare, root / "bare_fault.pt2", 1), labels
    )


def _origins(steps: list[dict[str, object]]) -> list[NodeOrigin]:
    """What each step of an engine's program records of the node it was built from."""
    recorded = [step.get("origin") for step in steps]
    return [NodeOrigin(str(o[0]), str(o[1])) for o in recorded if isinstance(o, list) and len(o) == 2]


def test_a_node_is_named_by_its_module_and_the_line_calling_it() -> None:
    """The innermost module of the stack, torch's own frames passed over, a re-export's wrapper naming nothing."""
    program = torch.export.export(Net().eval(), (torch.randn(3, 8),))
    origins = {node.name: node_origin(node) for node in program.graph.nodes if node.op == "call_function"}
    assert origins["linear"] == NodeOrigin("stages.0.fc (Linear)", _line("h = self.fc(x)"))
    assert origins["relu"] == NodeOrigin("stages.0.act (ReLU)", _line("h = self.act(h)"))
    assert origins["linear_3"] == NodeOrigin("stages.1.proj (Linear)", _line("return self.proj(h)"))
    coverage = covered(program.graph.nodes)
    assert coverage.modules[:2] == ("stages.0.fc (Linear)", "stages.0.act (ReLU)") and len(coverage.modules) == 6
    assert coverage.module_text() == (
        "stages.0.fc (Linear), stages.0.act (ReLU), stages.0.proj (Linear) and 3 more (6 modules)"
    )
    node = next(n for n in program.graph.nodes if n.name == "relu")
    node.meta["nn_module_stack"] = {"L__self__": ("", "torch.export._trace._non_strict_export.<locals>.Wrapper")}
    node.meta["stack_trace"] = '  File "<stdin>", line 3, in forward\n  File "<stdin>", line 9, in inner'
    assert node_origin(node) == NodeOrigin("", "<stdin>:9 in inner")


def test_verify_per_engine_names_the_engine_in_text_json_and_junit(saved: Saved, tmp_path: Path) -> None:
    where = f"engine 1 ({saved.labels[1]})"
    sources = f"{_line('return self.proj(h)')}; {_line('h = self.fc(x)')}"
    proc = cli("verify", str(saved.fault), "--per-engine", "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    divergence = report["divergence"]
    assert divergence["kind"] == "engine" and divergence["where"] == where, divergence
    assert divergence["modules"] == MIDDLE and divergence["source"] == sources, divergence
    origins = {row["engine"]: row["origin"] for row in report["boundaries"] if row["engine"] is not None}
    assert origins == {0: "stages.0.fc (Linear)", 1: ", ".join(MIDDLE), 2: "stages.1.proj (Linear)"}, origins

    junit = tmp_path / "verify.xml"
    proc = cli("verify", str(saved.fault), "--per-engine", "--junit", str(junit))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    text = proc.stdout
    assert f"first divergence: {where}\n  " in text, text
    assert f"\n  covers: {', '.join(MIDDLE)}\n  source: {sources}\n" in text, text
    assert "\nengines in the model (the modules their steps come from):\n  engine 0: stages.0.fc (Linear)\n" in text
    assert NOT_RECORDED not in text
    case = ET.parse(junit).getroot().find("testsuite/testcase")
    assert case is not None
    failure = next(f for f in case.iter("failure") if f.get("message", "").startswith("first divergence"))
    assert f"covers: {', '.join(MIDDLE)}" in (failure.text or "") and sources in (failure.text or "")
    assert f"source: {sources}" in (case.findtext("system-out") or "")


def test_diff_names_the_engine_and_the_repro_keeps_its_names(saved: Saved, tmp_path: Path) -> None:
    proc = cli("diff", str(saved.fault), str(saved.good), "--memory-limit", "2GiB")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"first divergence: engine 1 ({saved.labels[1]})\n" in proc.stdout, proc.stdout
    assert f"\n  covers: {', '.join(MIDDLE)}\n  source: {_line('return self.proj(h)')}; " in proc.stdout

    folder = tmp_path / "repro"
    assert cli("verify", str(saved.fault), "--per-engine", "--extract", str(folder)).returncode == 1
    alone = cli("verify", str(folder / "repro.pt2"), "--per-engine")
    assert alone.returncode == 1 and f"first divergence: engine 0 ({saved.labels[1]})\n" in alone.stdout, alone.stdout
    assert f"\n  covers: {', '.join(MIDDLE)}\n" in alone.stdout, alone.stdout


def test_inspect_lists_the_modules_each_engine_covers(saved: Saved) -> None:
    proc = cli("inspect", str(saved.good))
    assert proc.returncode == 0, proc.stderr
    covers = [" ".join(line.split()[1:]) for line in proc.stdout.splitlines() if line.startswith("  covers ")]
    assert covers == ["stages.0.fc (Linear)", ", ".join(MIDDLE), "stages.1.proj (Linear)"], proc.stdout
    assert NOT_RECORDED not in proc.stdout


def test_a_file_without_the_metadata_says_so_once(saved: Saved) -> None:
    proc = cli("verify", str(saved.bare_fault), "--per-engine")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"first divergence: engine 1 ({saved.labels[1]})\n" in proc.stdout, proc.stdout
    assert proc.stdout.count(NOT_RECORDED) == 1 and "covers" not in proc.stdout, proc.stdout
    inspected = cli("inspect", str(saved.bare_fault))
    assert inspected.returncode == 0, inspected.stderr
    assert inspected.stdout.count(NOT_RECORDED) == 1 and "covers" not in inspected.stdout, inspected.stdout


def test_a_fallback_region_is_named_where_its_nodes_carry_their_metadata(saved: Saved) -> None:
    """A changed fallback is named by its module and line (and the engines around it by theirs)."""
    program = torch.export.load(saved.good)
    relus = [n for n in program.graph.nodes if n.target is torch.ops.aten.relu.default]
    assert [n.name for n in relus] == ["relu", "relu_1"]
    assert node_origin(relus[1]) == NodeOrigin("stages.1.act (ReLU)", _line("h = self.act(h)"))
    relus[1].target = torch.ops.aten.sigmoid.default
    program.graph_module.recompile()
    recorded = decode_reference_io(reference_io_text(saved.good))
    assert recorded.boundaries is not None
    trace = trace_program(program.module(), [saved.x], {}, None, recorded.boundaries)
    _, divergence = localize(trace, Reference("the compiled module", recorded.boundaries, recorded.outputs), Criteria())
    assert divergence is not None and divergence.kind == "fallback", divergence
    assert divergence.where == "fallback region relu_1 (feeding engine 2 in[0])", divergence.where
    assert (divergence.module, divergence.source) == ("stages.1.act (ReLU)", _line("h = self.act(h)"))
    assert divergence.near == [
        f"reads getitem_1 = engine 1 output 0: engine 1 covers {', '.join(MIDDLE)}",
        "feeds engine 2 in[0]: engine 2 covers stages.1.proj (Linear)",
    ], divergence.near
    text = divergence.to_text()
    assert "\n  module: stages.1.act (ReLU)\n" in text and f"\n  source: {_line('h = self.act(h)')}\n" in text


def test_a_files_node_metadata_is_read_as_data_and_names_its_fallbacks(saved: Saved) -> None:
    """The strict reader reads each node's metadata as data (torch never gets it): the nodes of the program
    verify runs carry their module path and line, and ``inspect`` names the ops left to PyTorch by them."""
    from trt_inline.archive import open_file

    loaded = open_file(saved.good)
    relus = [n for n in loaded.module.graph.nodes if n.target is torch.ops.aten.relu.default]
    assert [n.name for n in relus] == ["relu", "relu_1"]
    assert node_origin(relus[1]) == NodeOrigin("stages.1.act (ReLU)", _line("h = self.act(h)"))
    assert node_origin(relus[0]) == NodeOrigin("stages.0.act (ReLU)", _line("h = self.act(h)"))
    # (torch never got the file's: no stack trace, and the empty module stack its deserializer gives every node)
    assert not any(n.meta.get("stack_trace") or n.meta.get("nn_module_stack") for n in loaded.program.graph.nodes)
    table = cli("inspect", str(saved.good)).stdout
    assert "stages.1.act (ReLU)" in table and _line("h = self.act(h)") in table, table


def test_crafted_node_metadata_names_nothing_it_should_not(saved: Saved, tmp_path: Path) -> None:
    """A file's metadata is its author's text: escaped and cut where it names a node, never in the code torch
    generates, and a malformed one (not text, too long, another shape) names nothing and refuses nothing."""
    from support.hostile import model_json_entry, rewrite

    from trt_inline.archive import open_file

    forged = 'File "model.py", line 7, in forward\n    h = x\x1b[2J\rimport os; os.system("x")\n' + "#" * 50

    def edit(entries: dict[str, bytes]) -> None:
        name = model_json_entry(entries)
        document = json.loads(entries[name])
        nodes = document["graph_module"]["graph"]["nodes"]
        relus = [n for n in nodes if n["target"] == "torch.ops.aten.relu.default"]
        assert len(relus) == 2  # (structure first: the two nodes planted in)
        relus[0]["metadata"] = {"stack_trace": forged, "nn_module_stack": "k,a.b\nc,<class 'X\x07'>"}
        relus[1]["metadata"] = {"stack_trace": "x" * (1 << 17), "nn_module_stack": "no commas"}
        entries[name] = json.dumps(document).encode()

    path = rewrite(saved.good, tmp_path / "forged.pt2", edit)
    loaded = open_file(path)
    relus = [n for n in loaded.module.graph.nodes if n.target is torch.ops.aten.relu.default]
    origin = node_origin(relus[0])
    assert origin.source.startswith("model.py:7 in forward: h = x") and "\x1b" not in origin.source, origin
    assert "\n" not in origin.module and "\x07" not in origin.module, origin
    assert node_origin(relus[1]) == NodeOrigin("", "")
    assert "os.system" not in loaded.module.code and "model.py" not in loaded.module.code
    assert trt_inline.verify(path).ok


def test_a_malformed_program_is_refused_before_its_metadata_is_read(saved: Saved, tmp_path: Path) -> None:
    """The metadata is read only from a document the schema check accepted: a node with a million outputs that
    are not arguments is refused as before, well within a time limit (a walk of it per node would not be)."""
    from support.hostile import model_json_entry, rewrite

    from trt_inline.errors import UnsafeArchiveError

    def edit(entries: dict[str, bytes]) -> None:
        name = model_json_entry(entries)
        document = json.loads(entries[name])
        document["graph_module"]["graph"]["nodes"][1]["outputs"] = [0] * 1_000_000
        entries[name] = json.dumps(document).encode()

    path = rewrite(saved.good, tmp_path / "outputs.pt2", edit)
    with pytest.raises(UnsafeArchiveError, match="expected a"):
        trt_inline.verify(path, timeout=300)
