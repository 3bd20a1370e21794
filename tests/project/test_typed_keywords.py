"""``.ci/typed_keywords``: the entry points' typed keywords are written from the option groups' fields, never by hand.

The repository's block is what the fields give; a field added to a group without writing the block again is found,
named, and ``--write`` puts it where the type checker reads it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from support.processes import REPO, new_interpreter

SCRIPT = REPO / ".ci" / "typed_keywords"
OPTIONS = Path("trt_inline") / "verify" / "options.py"
# A field planted in the Outputs group, taken by verify alone.
_PLANTED = """    save_summary: str | None = field(default=None, metadata=declared(
        "write a one-line summary here", "--save-summary", used_by=(VERIFY,), metavar="FILE"))
"""


def _run(root: Path, *arguments: str) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(root))
    done = new_interpreter(SCRIPT, *arguments, env=env, cwd=root, timeout=300, merged=True)
    return done.returncode, done.stdout


def test_the_repositorys_typed_keywords_are_the_fields() -> None:
    code, out = _run(REPO)
    assert code == 0, out
    assert out.strip() == f"{REPO / OPTIONS}: the typed keywords are the groups' fields"


def test_a_field_added_without_its_keyword_is_found_and_written(tmp_path: Path) -> None:
    shutil.copytree(REPO / "trt_inline", tmp_path / "trt_inline", ignore=shutil.ignore_patterns("__pycache__"))
    options = tmp_path / OPTIONS
    text = options.read_text()
    anchor = "class Outputs(OptionGroup):"
    # The field goes last in the group, before the group's closing "# fmt: on".
    start = text.index(anchor)
    end = text.index("    # fmt: on\n", start)
    options.write_text(text[:end] + _PLANTED + text[end:])
    code, out = _run(tmp_path)
    assert code == 1, out
    assert f"{options}: the typed keywords are not the groups' fields" in out, out  # (the copy's, not the repo's)
    assert "  + save_summary: str | None" in out.splitlines(), out
    code, out = _run(tmp_path, "--write")
    assert code == 0, out
    block = options.read_text().split("class OutputsFields(TypedDict, total=False):\n", 1)[1].split("\n\n", 1)[0]
    assert block.splitlines()[-1] == "    save_summary: str | None", block
    code, out = _run(tmp_path)
    assert code == 0, out
    # What the type checker reads: verify takes it (its TypedDict inherits the group's), diff does not.
    probe = (
        "import importlib, typing\n"
        "options = importlib.import_module('trt_inline.verify.options')\n"
        "print(sorted(set(typing.get_type_hints(options.VerifyFields, localns=vars(options)))"
        " - set(typing.get_type_hints(options.DiffFields, localns=vars(options)))))\n"
    )
    done = new_interpreter("-c", probe, env=dict(os.environ, PYTHONPATH=str(tmp_path)), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "'save_summary'" in done.stdout and "'strict'" in done.stdout, done.stdout
