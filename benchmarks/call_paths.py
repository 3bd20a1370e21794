"""The call paths of ``trt-inline verify`` and of ``find_fix``, and the largest functions: the layout, measured.

    python benchmarks/call_paths.py [--top 5]

Each path is traced with ``sys.setprofile`` over the package's own functions (calls into torch and the
standard library are left out): a *hop* is a call from one module of the package into another; a hop is
*upward* when the callee's floor (``.ci/imports``' ``FLOORS``) is above the caller's (a constructor is not:
a decoder builds the type it is given); an *edge* is a distinct
(calling function, called function) pair of different modules, counted once however often it runs. Three paths:

* ``verify (parent)``: ``trt-inline verify FILE`` from the command's handler (``run``, once the command line
  is parsed) to its verdict, in this process (the child it starts is a separate process and not traced here);
* ``verify (child)``: the same verification opened in this process (``isolate=False``): the child's side;
* ``find_fix``: the search on a small planted model, on the reference backend's own pipeline.

Then the five largest functions (lines) and the five longest parameter lists of the package.
"""

from __future__ import annotations

import argparse
import ast
import collections
import contextlib
import importlib.machinery
import importlib.util
import io
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _floors() -> Callable[[str], int | None]:
    loader = importlib.machinery.SourceFileLoader("ci_imports", str(ROOT / ".ci" / "imports"))
    spec = importlib.util.spec_from_loader("ci_imports", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module.floor_of  # type: ignore[no-any-return]


def _ours(module: str | None) -> bool:
    return bool(module) and (module == "trt_inline" or module.startswith(("trt_inline.", "trt_inline_")))  # type: ignore[union-attr]


@contextlib.contextmanager
def traced() -> Iterator[dict[str, Any]]:
    """Hops between the package's modules while the block runs."""
    floor_of = _floors()
    found: dict[str, Any] = {"hops": 0, "upward": 0, "entered": collections.Counter(), "edges": set(), "up": set()}

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = frame.f_globals.get("__name__")
        caller_frame = frame.f_back
        caller = caller_frame.f_globals.get("__name__") if caller_frame is not None else None
        if not _ours(callee) or not _ours(caller) or callee == caller:
            return
        found["hops"] += 1
        found["entered"][callee] += 1
        edge = (f"{caller}.{caller_frame.f_code.co_name}", f"{callee}.{frame.f_code.co_name}")  # type: ignore[union-attr]
        found["edges"].add(edge)
        low, high = floor_of(caller), floor_of(callee)
        # (a decoder building the declared type it was given is not a call back up: constructors are left out)
        constructor = frame.f_code.co_name in ("__init__", "__post_init__", "__new__")
        if low is not None and high is not None and high > low and not constructor:
            found["upward"] += 1
            found["up"].add(edge)

    sys.setprofile(profile)
    try:
        yield found
    finally:
        sys.setprofile(None)


def _summary(name: str, found: dict[str, Any]) -> None:
    entered: collections.Counter[str] = found["entered"]
    busiest = ", ".join(f"{module} {count}" for module, count in entered.most_common(3))
    print(
        f"{name:16s} {len(entered):>8d} {found['hops']:>6d} {found['upward']:>7d} {len(found['edges']):>6d} "
        f"{len(found['up']):>8d}   {busiest}"
    )


def _planted_file(folder: Path) -> Path:
    import torch

    from trt_inline import reference, save

    class Planted(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.linear(x)) + 1

    torch.manual_seed(0)
    model = Planted().eval()
    inputs = (torch.randn(2, 8),)
    compiled = reference.compile(model, inputs, torch_executed_ops={torch.ops.aten.relu.default}, min_block_size=1)
    path = folder / "planted.pt2"
    save(compiled, path, arg_inputs=inputs)
    return path


def _fix_model() -> tuple[Any, tuple[Any, ...]]:
    import torch

    class Wide(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(16, 16)
            self.b = torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.exp(self.a(x) * 30.0))

    torch.manual_seed(0)
    return Wide().eval(), (torch.randn(4, 16),)


def largest(top: int) -> None:
    sizes: list[tuple[int, str]] = []
    params: list[tuple[int, str]] = []
    for path in sorted((ROOT / "trt_inline").rglob("*.py")):
        tree = ast.parse(path.read_text())
        name = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                sizes.append((lines, f"{name}:{node.name}"))
                arguments = node.args
                count = len(arguments.posonlyargs) + len(arguments.args) + len(arguments.kwonlyargs)
                count -= bool(arguments.args) and arguments.args[0].arg in ("self", "cls")
                params.append((count, f"{name}:{node.name}"))
    print("largest functions (lines):", "; ".join(f"{where} {n}" for n, where in sorted(sizes, reverse=True)[:top]))
    print("longest parameter lists:", "; ".join(f"{where} {n}" for n, where in sorted(params, reverse=True)[:top]))


def main() -> int:
    warnings.simplefilter("ignore")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()
    from trt_inline import find_fix, verify
    from trt_inline.cli import _parser

    print(f"{'path':16s} {'modules':>8s} {'hops':>6s} {'upward':>7s} {'edges':>6s} {'up edges':>8s}   busiest modules")
    with tempfile.TemporaryDirectory() as folder:
        path = _planted_file(Path(folder))
        command = _parser().parse_args(["verify", str(path)])
        command.argv, command.started = None, 0.0
        with contextlib.redirect_stdout(io.StringIO()), traced() as found:
            code = command.run(command)
        assert code == 0, f"verify exited {code}"
        _summary("verify (parent)", found)
        with traced() as found:
            report = verify(str(path), isolate=False)
        assert report.status == "PASS", report.status
        _summary("verify (child)", found)
    model, inputs = _fix_model()
    with traced() as found:
        find_fix(model, inputs, max_compiles=6)
    _summary("find_fix", found)
    largest(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
