"""The documentation agrees with the tree, and its runnable code blocks run as shown.

README.md and the pages of docs/ (the site mkdocs.yml builds): every relative link names a file that
exists (and a heading, where it names one), every page is in the site's navigation, the layout
table names every module of every package, and what the README repeats of the pages (the release
pairs, the GPU suite's commands, the example's output) is what the pages say.

A code block marked ``<!-- runnable -->`` on the line before its fence runs with ``bash -euo
pipefail`` from the repository root, the directory of this interpreter first on ``PATH`` and a
temporary folder of the page's own as ``TMPDIR``, the page's blocks in order; it must exit 0, and
print every line of the output it shows (a transcript's lines that do not start with ``$ ``, or the
next block, marked ``<!-- output -->``). The format: docs/development.md, "Runnable blocks". Running
them takes one to two minutes: marked ``docs``, they run with ``--docs`` (.ci/run passes it); finding
and counting them is cheap and runs in every suite.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.pairs import release_for_torch, release_site_or_skip
from support.processes import REPO

DOCS = REPO / "docs"
# Each marked block is counted: a marker that stops matching must not make the test pass with fewer.
RUNNABLE_BLOCKS = 10

MARKER = re.compile(r"^(?P<indent>[ \t]*)<!-- (?P<kind>runnable|output)(?:; varies: (?P<varies>[^>]*?))? -->\s*$")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]+)\]\((?P<target>[^)\s]+)\)")
SNIPPET = re.compile(r'^--8<-- "(?P<path>[^"]+)"\s*$')


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def relative(page: Path) -> str:
    return page.relative_to(REPO).as_posix() if REPO in page.parents else str(page)


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, counted from 1
    text: list[str]  # its lines, the fence's indentation removed
    kind: str | None = None  # "runnable", "output" or None (unmarked)
    varies: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{relative(self.page)}:{self.line}"


@dataclass
class Runnable:
    block: Block
    script: str
    expected: list[str] = field(default_factory=list)
    varies: tuple[str, ...] = ()


def blocks(page: Path) -> list[Block]:
    """Every fenced block of a page, with the marker on the line before its fence, if any."""
    lines = page.read_text().split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        end = i + 1
        while end < len(lines) and not re.match(rf"^[ \t]*{fence[0]}{{{len(fence)},}}\s*$", lines[end]):
            end += 1
        text = [line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines[i + 1 : end]]
        block = Block(page, i + 1, text)
        marker = MARKER.match(lines[i - 1]) if i > 0 else None
        if marker is not None:
            assert marker["indent"] == indent, f"{block.where}: the marker is not at its fence's indentation"
            block.kind = marker["kind"]
            block.varies = tuple(word.strip() for word in (marker["varies"] or "").split(",") if word.strip())
        found.append(block)
        i = end + 1
    return found


def runnables(page: Path) -> list[Runnable]:
    """The page's runnable blocks in order, each with the output it shows."""
    found: list[Runnable] = []
    marked = [block for block in blocks(page) if block.kind is not None]
    for index, block in enumerate(marked):
        if block.kind == "output":
            before = marked[index - 1] if index else None
            assert before is not None and before.kind == "runnable" and not is_transcript(before), (
                f"{block.where}: an output block must follow a runnable block of commands"
            )
            continue
        if is_transcript(block):
            commands, expected = split_transcript(block)
            found.append(Runnable(block, "\n".join(commands), expected, block.varies))
        else:
            after = marked[index + 1] if index + 1 < len(marked) else None
            shown = after if after is not None and after.kind == "output" else None
            found.append(
                Runnable(block, "\n".join(block.text), shown.text if shown else [], shown.varies if shown else ())
            )
    return found


def is_transcript(block: Block) -> bool:
    return any(line.startswith("$ ") for line in block.text)


def split_transcript(block: Block) -> tuple[list[str], list[str]]:
    commands: list[str] = []
    expected: list[str] = []
    continued = False
    for line in block.text:
        if line.startswith("$ ") or continued:
            commands.append(line[2:] if line.startswith("$ ") and not continued else line)
            continued = line.endswith("\\")
        else:
            expected.append(line)
    return commands, expected


def patterns(expected: list[str], varies: tuple[str, ...]) -> Iterator[tuple[str, re.Pattern[str]]]:
    """A pattern for each line that must appear: ``...`` is any text, ``XXXXXXXX`` a temporary name's 8 characters."""
    for line in expected:
        line = line.rstrip()
        if not line.strip() or line.strip() == "..." or line.split()[0] in varies:
            continue
        pattern = re.escape(line).replace(re.escape("..."), ".*").replace("XXXXXXXX", r"\w{8}")
        yield line, re.compile(pattern)


def all_runnables() -> list[Runnable]:
    return [runnable for page in pages() for runnable in runnables(page)]


def pages_with_runnables() -> list[Path]:
    return [page for page in pages() if runnables(page)]


# -- cheap: every run ---------------------------------------------------------------------------------


def test_runnable_blocks_are_found() -> None:
    found = all_runnables()
    assert len(found) >= RUNNABLE_BLOCKS, [runnable.block.where for runnable in found]
    assert any(runnable.block.page.name == "README.md" for runnable in found)
    for runnable in found:
        assert runnable.script.strip(), f"{runnable.block.where}: a runnable block with no command"


def test_the_block_parser_reads_transcripts_and_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- runnable; varies: torch, CUDA -->\n```\n$ trt-inline doctor \\\n  --debug\ntorch  2.13\n"
        "entry point  registered\n```\n\n- item:\n\n  <!-- runnable -->\n  ```bash\n  echo a\n  ```\n\n"
        "  <!-- output -->\n  ```\n  a ... c\n  ...\n  ```\n\n```bash\nnot marked\n```\n"
    )
    first, second = runnables(page)
    assert first.script == "trt-inline doctor \\\n  --debug"
    assert first.expected == ["torch  2.13", "entry point  registered"] and first.varies == ("torch", "CUDA")
    assert [line for line, _ in patterns(first.expected, first.varies)] == ["entry point  registered"]
    assert second.script == "echo a" and second.expected == ["a ... c", "..."]
    [(_, pattern)] = patterns(second.expected, ())
    assert pattern.fullmatch("a b c") and not pattern.fullmatch("b c")
    [(_, pattern)] = patterns(["in /tmp/tmpXXXXXXXX/x"], ())
    assert pattern.fullmatch("in /tmp/tmpa_1b2c3d/x") and not pattern.fullmatch("in /tmp/tmpa_1/x")


def headings(page: Path) -> set[str]:
    """The anchors of a page's headings, as the site makes them (files a page includes whole among them)."""
    lines: list[str] = []
    for line in page.read_text().split("\n"):
        snippet = SNIPPET.match(line)
        lines.extend((REPO / snippet["path"]).read_text().split("\n") if snippet else [line])
    anchors: set[str] = set()
    fence: str | None = None
    for line in lines:
        opening = FENCE.match(line)
        if opening is not None:
            mark = opening["fence"][0]
            fence = None if fence == mark else fence or mark
            continue
        heading = re.match(r"^#{1,6} (.+?)\s*#*$", line)
        if fence is None and heading is not None:
            anchors.add(slug(heading[1]))
    return anchors


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def links(page: Path) -> Iterator[tuple[str, str]]:
    """(target, fragment) of every relative link of a page outside code."""
    in_fence: str | None = None
    for line in page.read_text().split("\n"):
        opening = FENCE.match(line)
        if opening is not None:
            mark = opening["fence"][0]
            in_fence = None if in_fence == mark else in_fence or mark
            continue
        if in_fence is not None:
            continue
        for match in LINK.finditer(re.sub(r"`[^`]*`", "``", line)):
            target = match["target"]
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            path, _, fragment = target.partition("#")
            yield path, fragment


@pytest.mark.parametrize("page", pages(), ids=relative)
def test_relative_links_name_files_and_headings_that_exist(page: Path) -> None:
    for path, fragment in links(page):
        target = (page.parent / path).resolve() if path else page
        where = f"{relative(page)}: ({path}#{fragment})"
        assert target.exists(), f"{where} names a file that does not exist"
        assert REPO in target.parents or target == REPO, f"{where} leaves the repository"
        if page != REPO / "README.md" and path:
            assert DOCS in target.parents, f"{where}: a page links only to pages of the site"
        if fragment and target.suffix == ".md" and DOCS / "api" not in target.parents:
            assert fragment in headings(target), f"{where}: no heading makes the anchor #{fragment}"


def nav_pages() -> list[str]:
    """The pages mkdocs.yml's nav names (read as text: the docs extra, with a YAML reader, may be absent)."""
    text = (REPO / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:") :]
    return re.findall(r"^\s+- (?:[^:\n]+: )?(\S+\.md)\s*$", nav, flags=re.MULTILINE)


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    listed = nav_pages()
    assert len(listed) == len(set(listed)), "a page is listed twice"
    assert sorted(listed) == sorted(page.relative_to(DOCS).as_posix() for page in DOCS.rglob("*.md"))


def test_mkdocs_builds_strictly_into_no_folder_of_the_repository() -> None:
    text = (REPO / "mkdocs.yml").read_text()
    assert re.search(r"^strict: true$", text, flags=re.MULTILINE)
    for check in ("omitted_files", "not_found", "anchors", "absolute_links", "unrecognized_links"):
        assert re.search(rf"^\s+{check}: warn$", text, flags=re.MULTILINE), check
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r'^\.venv/bin/mkdocs build --strict --site-dir "\$site_dir"$', ci, flags=re.MULTILINE)
    assert 'site_dir="$(mktemp -d)"' in ci
    assert "site/" in (REPO / ".gitignore").read_text().split("\n")


def layout_section() -> str:
    text = (DOCS / "development.md").read_text()
    start = text.index("\n## Layout")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def test_the_layout_table_names_every_module_of_every_package() -> None:
    section = layout_section()
    rows = dict(re.findall(r"^\| `(trt_inline/\w+/)` \| (.*) \|$", section, flags=re.MULTILINE))
    for package in sorted(path for path in (REPO / "trt_inline").iterdir() if (path / "__init__.py").exists()):
        row = rows.get(f"trt_inline/{package.name}/")
        assert row is not None, f"the layout table has no row for trt_inline/{package.name}/"
        modules = {path.name for path in package.glob("*.py")} - {"__init__.py"}
        named = set(re.findall(r"`(\w+\.py)`", row)) - {"__init__.py"}
        assert modules - named == set(), f"trt_inline/{package.name}/: the row does not name {modules - named}"
        assert named - modules == set(), f"trt_inline/{package.name}/: the row names {named - modules}, not there"
    for module in sorted((REPO / "trt_inline").glob("*.py")):
        if module.name != "__init__.py":
            assert f"`{module.name}`" in section or f"`trt_inline/{module.name}`" in section, module.name


def table_pairs(text: str) -> dict[str, str]:
    return dict(re.findall(r"^\| (2\.\d+\.\d+|none yet) \| (2\.\d+\.\d+) \|", text, flags=re.MULTILINE))


def test_the_readme_repeats_what_the_pages_say() -> None:
    readme = (REPO / "README.md").read_text()
    compatibility = (DOCS / "doors-and-compatibility.md").read_text()
    assert table_pairs(readme) == table_pairs(compatibility[compatibility.index("\n## Compatibility") :])
    development = (DOCS / "development.md").read_text()
    for command in re.findall(r"^docker (?:build|run) .*$", readme, flags=re.MULTILINE):
        assert command in development, command
    # The example's output: the README's first screen, and the overview page that runs it.
    [readme_output] = [block.text for block in blocks(REPO / "README.md") if block.text[0].startswith("TensorRT not")]
    [index_output] = [block.text for block in blocks(DOCS / "index.md") if block.kind == "output"]
    assert readme_output == index_output


# -- the blocks themselves: --docs ------------------------------------------------------------------


@pytest.mark.docs
@pytest.mark.parametrize("page", pages_with_runnables(), ids=relative)
def test_runnable_blocks_run_as_shown(page: Path, tmp_path: Path) -> None:
    """In the environment the README's main job makes: the release this torch pairs with installed without its
    requirements (its package first on the path), the reference backend taking its pipeline."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["TMPDIR"] = str(tmp_path)
    env.pop("TRT_INLINE_PIPELINE", None)  # (tests/conftest.py's choice for the suite's own models)
    record = release_for_torch()
    if record is not None:
        site = release_site_or_skip(record.version)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")]))
    for runnable in runnables(page):
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", runnable.script],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=600,
            check=False,
        )
        where = f"{runnable.block.where}:\n{runnable.script}\n--- printed ---\n{done.stdout[-6000:]}"
        assert done.returncode == 0, f"exit status {done.returncode} at {where}"
        # The pages show the paths a run without TMPDIR prints.
        printed = [line.rstrip().replace(str(tmp_path), "/tmp") for line in done.stdout.split("\n")]
        for line, pattern in patterns(runnable.expected, runnable.varies):
            assert any(pattern.fullmatch(out) for out in printed), f"not printed: {line!r} at {where}"
