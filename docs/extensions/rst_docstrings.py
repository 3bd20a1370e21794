"""The package's docstrings, written in reStructuredText, as the Markdown the API reference renders.

A Griffe extension (mkdocs.yml: mkdocstrings' ``extensions``), applied to the docstrings as they are
loaded; the source files are not changed. Three constructs need it:

* roles (``:func:`load```, ``:mod:`.reference```, ``:meth:`~trt_inline.x.Y.z```) become code that
  links to the object's entry where the reference documents it, and stays plain code where it does
  not (an optional cross-reference: never a warning);
* simple tables (``====  ====`` borders) become Markdown tables, a row's continuation lines joined;
* a paragraph ending in ``::`` ends in ``:``, and the indented literal block after it becomes a
  fenced code block.

Double backticks need nothing: Markdown reads them as code too.
"""

from __future__ import annotations

import html
import itertools
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|mod|class|meth|attr|data|exc|obj|const):`(~?)([^`]+)`")
BORDER = re.compile(r"^(\s*)=+(?: +=+)+\s*$")


class RstDocstrings(griffe.Extension):
    """Rewrites every docstring of a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = to_markdown(obj.docstring.value, obj)

    # The same event under its Griffe 1 name (mkdocstrings-python 2.0 accepts griffe>=1.13). Where both
    # are called, the second finds nothing left to rewrite.
    on_package_loaded = on_package


def _objects(obj: griffe.Object) -> list[griffe.Object]:
    found = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            found.extend(_objects(member))  # type: ignore[arg-type]
    return found


def to_markdown(text: str, obj: griffe.Object | None = None) -> str:
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if BORDER.match(line):
            end = _table_end(lines, i)
            if end is not None:
                out.extend(_table(lines[i : end + 1], obj))
                i = end + 1
                continue
        if line.rstrip().endswith("::") and not line.strip().startswith(">>>"):
            block, after = _literal_block(lines, i + 1)
            if block:
                head = line.rstrip()[:-2].rstrip()
                if head:
                    out.append(_roles(head + ":", obj))
                out.extend(["", "```text", *block, "```", ""])
                i = after
                continue
        out.append(_roles(line, obj))
        i += 1
    return "\n".join(out)


def _literal_block(lines: list[str], start: int) -> tuple[list[str], int]:
    """The indented block after a ``::`` line (blank lines first allowed), dedented; and where it ends."""
    i = start
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines) or not lines[i].startswith((" ", "\t")):
        return [], start
    indent = len(lines[i]) - len(lines[i].lstrip())
    block: list[str] = []
    while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) >= indent):
        block.append(lines[i][indent:])
        i += 1
    while block and not block[-1].strip():
        block.pop()
        i -= 1
    return block, i


def _table_end(lines: list[str], start: int) -> int | None:
    """A simple table's closing border: the first border after ``start`` that a blank line (or the end) follows."""
    for j in range(start + 1, len(lines)):
        if BORDER.match(lines[j]) and (j + 1 == len(lines) or not lines[j + 1].strip()):
            return j
    return None


def _columns(border: str) -> list[int]:
    return [m.start() for m in re.finditer(r"=+", border)]


def _cells(line: str, starts: list[int]) -> list[str]:
    """A row cut at the columns' starts; text that runs past a column's start moves the cut to the next gap."""
    cuts = [starts[0]]
    for start in starts[1:]:
        cut = max(start, cuts[-1])
        if cut < len(line) and line[cut - 1] != " ":
            gap = line.find("  ", cut)
            cut = gap if gap >= 0 else len(line)
        cuts.append(cut)
    cuts.append(len(line))
    return [line[a:b].strip() for a, b in itertools.pairwise(cuts)]


def _table(block: list[str], obj: griffe.Object | None) -> list[str]:
    """A simple table as a Markdown table: a row whose first cell is blank continues the row above."""
    starts = _columns(block[0])
    borders = [j for j, line in enumerate(block) if BORDER.match(line)]
    header: list[str] | None = None
    rows: list[list[str]] = []
    for j, line in enumerate(block):
        if j in borders:
            if len(borders) == 3 and j == borders[1]:
                header, rows = (rows[0] if rows else [""] * len(starts)), []
            continue
        cells = _cells(line, starts)
        if rows and not cells[0]:
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells, strict=True)]
        else:
            rows.append(cells)
    if header is None:
        header, rows = rows[0], rows[1:]
    markdown = []
    for row in [header, ["---"] * len(starts), *rows]:
        markdown.append("| " + " | ".join(_roles(cell, obj).replace("|", "\\|") for cell in row) + " |")
    return ["", *markdown, ""]


def _roles(line: str, obj: griffe.Object | None) -> str:
    def link(match: re.Match[str]) -> str:
        short, target = match.group(1) == "~", match.group(2)
        shown = target.lstrip(".").rsplit(".", 1)[-1] if short else target
        identifier = _resolve(target, obj)
        return f'<autoref identifier="{html.escape(identifier)}" optional><code>{html.escape(shown)}</code></autoref>'

    return ROLE.sub(link, line)


def _resolve(target: str, obj: griffe.Object | None) -> str:
    """The full path of a role's target, looked up in the docstring's scope where it is not one already."""
    target = target.lstrip("~")
    if obj is None:
        return target.lstrip(".")
    module = obj if obj.is_module else obj.module
    if target.startswith("."):
        package = module if module.is_package else module.parent
        return f"{package.path}{target}" if package is not None else target.lstrip(".")
    first, _, rest = target.partition(".")
    if first == module.package.name:
        return target
    scope: griffe.Object | None = obj
    while scope is not None:
        try:
            found = scope.resolve(first)
        except (griffe.NameResolutionError, AttributeError):
            scope = scope.parent
            continue
        return f"{found}.{rest}" if rest else found
    return target
