"""What verification found: per-output comparisons and the report, as text or JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

__all__ = ["OutputComparison", "VerifyReport", "describe_value"]


def describe_value(val: Any) -> str:
    """``float32[2, 3, 8, 8]`` for a tensor (fake or real), ``int`` for a scalar, the type's name otherwise."""
    if isinstance(val, torch.Tensor):
        return f"{str(val.dtype).removeprefix('torch.')}{list(val.shape)}"
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return type(val).__name__.removeprefix("Sym").lower()
    return type(val).__name__


@dataclass
class OutputComparison:
    index: int
    shape: list[int]
    dtype: str
    max_abs_diff: float
    max_rel_diff: float
    atol: float
    rtol: float
    ok: bool
    problem: str | None = None


@dataclass
class VerifyReport:
    """What :func:`trt_inline.verify` found.

    ``ok`` means every structural check passed *and* outputs were compared and agree.
    """

    source: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    outputs: list[OutputComparison] = field(default_factory=list)
    # Where the expected outputs came from: "embedded", "given", "module", "from NEW.pt2", or "none".
    expected_source: str = "none"
    allow_pickle: bool = False
    # Where the file was loaded in a child process: that child's peak resident memory above
    # its resident memory once its imports were done (what loading and running the file cost).
    child_peak_extra_bytes: int | None = None

    @property
    def compared(self) -> bool:
        return self.expected_source != "none"

    @property
    def ok(self) -> bool:
        return not self.problems and self.compared and all(o.ok for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        result = asdict(self)
        result.update(ok=self.ok, compared=self.compared)
        return result

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VerifyReport:
        """The report :meth:`to_dict` gave (how a child process hands its report back)."""
        return cls(
            source=str(data["source"]),
            problems=[str(p) for p in data["problems"]],
            notes=[str(n) for n in data["notes"]],
            outputs=[OutputComparison(**output) for output in data["outputs"]],
            expected_source=str(data["expected_source"]),
            allow_pickle=bool(data["allow_pickle"]),
            child_peak_extra_bytes=data.get("child_peak_extra_bytes"),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def to_text(self) -> str:
        status = "PASS" if self.ok else ("FAIL" if self.problems else "UNVERIFIED")
        lines = [f"{status} {self.source} (expected outputs: {self.expected_source})"]
        for output in self.outputs:
            dims = ", ".join(map(str, output.shape))
            mark = "ok  " if output.ok else "DIFF"
            lines.append(
                f"  {mark} output {output.index}  {output.dtype}[{dims}]  max abs diff {output.max_abs_diff:.6g}  "
                f"max rel diff {output.max_rel_diff:.6g}  (atol {output.atol:g}, rtol {output.rtol:g})"
            )
        lines += [f"  problem: {problem}" for problem in self.problems]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)
