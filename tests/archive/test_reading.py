"""Reading files larger than memory: weights mapped, inspect without weights, progress, memory errors, file mode.

(The 1 GiB budgets are in ``tests/project/test_memory.py``, run with ``--memory``.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from support.hostile import read_entries, write_entries
from support.processes import REPO, new_interpreter, run_with_stderr_on_a_terminal
from support.programs import SavedSeed

import trt_inline
from trt_inline import cli, isolation
from trt_inline.archive.reader import read_file
from trt_inline.errors import IsolationError


def _truncated_records(good: Path, target: Path) -> tuple[Path, list[str]]:
    """``good`` with every raw tensor record cut to half its bytes (the zip itself stays whole)."""
    entries = read_entries(good)
    records = [n for n in entries if "/data/constants/tensor_" in n or "/data/weights/weight_" in n]
    records = [n for n in records if len(entries[n]) > 1]
    for name in records:
        entries[name] = entries[name][: len(entries[name]) // 2]
    return write_entries(target, entries), records


def test_inspect_reads_no_tensor_record(
    saved_seed: SavedSeed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Records cut short: inspect shows the graph (it maps and reads none of them); verify refuses, naming one."""
    path, records = _truncated_records(saved_seed.good, tmp_path / "truncated.pt2")
    if not records:
        pytest.skip(f"torch {torch.__version__} keeps tensors in one torch.save blob, not in raw records")
    assert cli.main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "engine 0" in out and "execute_engine" in out, out
    assert cli.main(["verify", str(path)]) == 2
    err = capsys.readouterr().err
    assert "refused" in err and "reaching past its record" in err and any(r in err for r in records), err


def _mapped_from(path: Path) -> list[tuple[int, int]]:
    """Address ranges of this process mapped from ``path`` (``/proc/self/maps``)."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == str(path.resolve()):
                start, end = (int(bound, 16) for bound in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def test_a_loaded_file_runs_on_weights_mapped_from_it(saved_seed: SavedSeed) -> None:
    """``trt_inline.load``: every tensor constant lies in a mapping of the file; it computes as torch's load does."""
    program = trt_inline.load(saved_seed.good)
    stock = torch.export.load(saved_seed.good)
    with torch.no_grad():
        ours, theirs = program.module()(saved_seed.x), stock.module()(saved_seed.x)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    constants = [t for t in program.constants.values() if isinstance(t, torch.Tensor) and t.numel()]
    assert constants, "the engines' payloads are constants"
    if read_file(saved_seed.good).layout.startswith("PT2 archive (torch 2.9+)"):
        ranges = _mapped_from(saved_seed.good)
        assert ranges, "the file is mapped"
        outside = [t.shape for t in constants if not any(start <= t.data_ptr() < end for start, end in ranges)]
        assert outside == [], f"constants read into memory rather than mapped: {outside}"
    else:  # (torch 2.5 ... 2.8 keep them in a torch.save blob their writer does not align: copied, aligned)
        assert all(t.untyped_storage().data_ptr() % 64 == 0 for t in constants)


def test_read_ahead_stays_a_window_ahead_of_the_pages_the_program_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading
    import time

    from trt_inline.archive.views import FileView
    from trt_inline.isolation.read_ahead import ReadingAhead

    mib = 1 << 20
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(1024) * (320 * 1024))  # 320 MiB
    monkeypatch.setattr(isolation.limits, "available_memory", lambda: 2)  # the smallest window: 64 MiB
    view = FileView(path)

    def settled(reader: ReadingAhead, at_least: int) -> int:
        deadline = time.monotonic() + 30
        while reader.position < at_least and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # had it gone on, it would have by now
        return reader.position

    with view.reading_ahead():
        (reader,) = view._reader
        assert reader.paced and reader.window == 64 * mib and not reader.by_parent
        assert settled(reader, 64 * mib) == 64 * mib  # nothing touched yet: one window, no further
        weights = view.tensor(0, 160 * mib, torch.uint8)
        assert int(weights[: 160 * mib : 4096].sum()) >= 0  # the program touches its first 160 MiB
        position = settled(reader, 200 * mib)
        assert 160 * mib + 64 * mib - 4 * mib <= position <= 160 * mib + 64 * mib
    assert not [t for t in threading.enumerate() if t.name.startswith("trt-inline-read-ahead")]

    # A view collected while reading ahead stops its reader and closes its descriptors: nothing is left behind.
    # (Counted by what they name: another test's garbage may close its own files at any moment.)
    def open_here() -> list[str]:
        names = []
        for descriptor in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{descriptor}")
                names += [target] if target == str(path.resolve()) or target.endswith("/pagemap") else []
        return sorted(names)

    before = open_here()
    collected = FileView(path)
    assert collected.start_reading_ahead()
    assert len(open_here()) == len(before) + 3, "its descriptor, its mapping's and pagemap's"
    del collected
    assert not [t for t in threading.enumerate() if t.name.startswith("trt-inline-read-ahead")]
    assert open_here() == before


@pytest.mark.heavy
def test_progress_on_a_terminal_and_never_when_piped_or_json(saved_seed: SavedSeed) -> None:
    code, out, err = run_with_stderr_on_a_terminal("verify", str(saved_seed.good))
    assert code == 0 and out.startswith("PASS"), out + err
    lines = [line for line in err.splitlines() if line.startswith("trt-inline: [")]
    assert any("reading the archive" in line for line in lines), err
    assert any("running the program on the reference inputs" in line for line in lines), err

    code, out, err = run_with_stderr_on_a_terminal("verify", str(saved_seed.good), "--json")
    assert code == 0 and out.lstrip().startswith("{"), out
    assert "trt-inline: [" not in err, err

    piped = new_interpreter("-m", "trt_inline", "verify", saved_seed.good, cwd=REPO, timeout=300)
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    asked = cli.main(["verify", str(saved_seed.good), "--progress"])
    assert asked == 0


def test_progress_reaches_python_through_the_logger(
    saved_seed: SavedSeed, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with caplog.at_level(logging.INFO, logger="trt_inline.progress"):
        assert trt_inline.verify(saved_seed.good).ok
    messages = [r.getMessage() for r in caplog.records if r.name == "trt_inline.progress"]
    assert any("reading the archive" in m for m in messages), messages
    assert capsys.readouterr().err == "", "the library prints nothing"
    assert cli.main(["verify", str(saved_seed.good), "--progress"]) == 0
    err = capsys.readouterr().err
    assert "checking what runs" in err and err.count("\n") >= 4, err


def test_a_file_that_cannot_fit_is_refused_before_it_is_read(
    saved_seed: SavedSeed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that must be read into memory (it cannot be mapped) past the limit: refused at once, with the figures."""
    monkeypatch.setattr(isolation.child, "unmappable", lambda path: "a file system without mmap")
    with pytest.raises(IsolationError, match=r"cannot be mapped here \(a file system without mmap\)") as refused:
        trt_inline.verify(saved_seed.good, memory_limit=1000)
    assert "past the memory limit of 1000 B (--memory-limit raises it" in str(refused.value)


def test_the_default_memory_limit_follows_what_the_machine_has(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    big = tmp_path / "big.pt2"
    with open(big, "wb") as handle:
        handle.truncate(40 << 30)  # sparse: 40 GiB of size, nothing on disk
    monkeypatch.setattr(isolation.limits, "available_memory", lambda: 24 << 30)
    assert isolation.default_memory_limit(big) == (24 << 30) * 4 // 5, "at most 80% of what is available"
    monkeypatch.setattr(isolation.limits, "available_memory", lambda: 256 << 30)
    assert isolation.default_memory_limit(big) == (2 << 30) + (20 << 30), "2 GiB and half the file"


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_saved_files_get_the_mode_torch_export_save_gives(saved_seed: SavedSeed, tmp_path: Path, umask: int) -> None:
    previous = os.umask(umask)
    try:
        trt_inline.save(saved_seed.compiled, tmp_path / "ours.pt2", arg_inputs=(saved_seed.x,))
        torch.export.save(torch.export.load(saved_seed.good), tmp_path / "torch.pt2")
    finally:
        os.umask(previous)
    ours, theirs = ((tmp_path / name).stat().st_mode & 0o777 for name in ("ours.pt2", "torch.pt2"))
    assert ours == theirs == 0o666 & ~umask, (oct(ours), oct(theirs))
    assert zipfile.is_zipfile(tmp_path / "ours.pt2")


def test_read_ahead_of_a_file_larger_than_memory_lets_go_of_pages_well_behind_the_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mmap
    import time

    from trt_inline.isolation import read_ahead

    mib = 1 << 20
    path = tmp_path / "big.bin"
    with open(path, "wb") as handle:
        block = os.urandom(mib)
        for _ in range(768):
            handle.write(block)
    monkeypatch.setattr(isolation.limits, "available_memory", lambda: 2)  # a 64 MiB window
    monkeypatch.setattr(read_ahead.Pacer, "_LAG", 64 * mib)
    descriptor = os.open(path, os.O_RDONLY)
    pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        mapped = mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ)  # how a file larger than memory is mapped
        with warnings.catch_warnings():  # torch warns (once per process, on some versions) that it is read-only
            warnings.simplefilter("ignore", UserWarning)
            weights = torch.frombuffer(mapped, dtype=torch.uint8)

        def mapped_here(offset: int) -> bool:
            entry = os.pread(pagemap, 8, (weights.data_ptr() + offset) // mmap.PAGESIZE * 8)
            return bool(int.from_bytes(entry, "little") >> 63)

        assert int(weights[: 512 * mib : 4096].sum()) >= 0  # the program reads its first 512 MiB
        assert mapped_here(0) and mapped_here(256 * mib)
        reading = read_ahead.start(descriptor, mapped, path.stat().st_size, release=True)
        deadline = time.monotonic() + 30
        while reading.pacer.released < 384 * mib and time.monotonic() < deadline:
            time.sleep(0.02)
        reading.stop()
        assert reading.pacer.released >= 384 * mib, reading.pacer.released
        assert not mapped_here(0) and not mapped_here(256 * mib), "pages well behind the program are let go"
        assert mapped_here(500 * mib), "the last 64 MiB before the program are kept"
        assert int(weights[:4096].sum()) >= 0 and mapped_here(0)  # and read again as any page would be
    finally:
        os.close(pagemap)
        os.close(descriptor)


def test_a_child_paces_the_reading_its_parent_does(tmp_path: Path) -> None:
    """The feed end to end in one process: a pacer on a mapping moves, over a pipe, a reader of the same file."""
    import mmap
    import time

    from trt_inline.isolation import read_ahead

    mib = 1 << 20
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(1024) * (320 * 1024))  # 320 MiB
    feed_read, feed_write = os.pipe()
    descriptor = os.open(path, os.O_RDONLY)
    parent = read_ahead.FeedReader(str(path), 64 * mib)
    try:
        feed = read_ahead.Feed(feed_write, parent.identity, 64 * mib)
        assert feed.serves(descriptor)
        with open(tmp_path / "other.bin", "wb") as other:
            assert not feed.serves(other.fileno()), "another file is read by the child itself"

        def parent_settled(at_least: int, run: int = 1) -> int:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                ready, _, _ = select.select([feed_read], [], [], 0.05)
                if ready:
                    parent.take(os.read(feed_read, 1 << 16))
                elif parent.reader.position >= at_least and parent._run == run:
                    break
            time.sleep(0.3)  # had it gone on, it would have by now
            return parent.reader.position

        assert parent_settled(64 * mib) == 64 * mib, "before the child says anything: the first window"
        mapped = mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            weights = torch.frombuffer(mapped, dtype=torch.uint8)
        pacer = read_ahead.Pacer(mapped, path.stat().st_size, feed.window, feed.mover())
        try:
            assert int(weights[: 160 * mib : 4096].sum()) >= 0  # the program touches its first 160 MiB
            position = parent_settled(200 * mib)
            assert 160 * mib + 64 * mib - 4 * mib <= position <= 160 * mib + 64 * mib, position
        finally:
            pacer.stop()
        restarted = read_ahead.Pacer(mapped, path.stat().st_size, feed.window, feed.mover())  # a second run
        try:
            restarts = parent.reader._restarts
            position = parent_settled(200 * mib, run=2)
            assert parent.reader._restarts == restarts + 1, "a new run reads from the start again"
            assert 160 * mib + 64 * mib - 4 * mib <= position <= 160 * mib + 64 * mib, position
        finally:
            restarted.stop()
    finally:
        parent.stop()
        for end in (feed_read, feed_write, descriptor):
            os.close(end)


def test_the_parent_trusts_no_record_of_the_feed(tmp_path: Path) -> None:
    """Records are untrusted: cut ones wait for their rest, targets stay within the file, old runs change nothing."""
    import struct
    import time

    from trt_inline.isolation import read_ahead

    mib = 1 << 20
    path = tmp_path / "big.bin"
    path.write_bytes(b"\1" * (80 * mib))
    parent = read_ahead.FeedReader(str(path), 0)
    record = struct.Struct("<QQ")

    def position_after(data: bytes) -> int:
        parent.take(data)
        time.sleep(0.3)
        return parent.reader.position

    try:
        assert position_after(b"") == 0
        assert position_after(record.pack(1, 4 * mib) + record.pack(1, 2 * mib)) == 2 * mib, "the last record counts"
        whole = record.pack(1, 16 * mib)
        assert position_after(whole[:7]) == 2 * mib, "half a record moves nothing"
        assert position_after(whole[7:]) == 16 * mib
        assert position_after(record.pack(1, (1 << 64) - 1)) == 80 * mib, "a target past the end: the end"
        assert position_after(record.pack(3, 8 * mib)) == 8 * mib and parent._run == 3, "a new run: from 0"
        assert position_after(record.pack(2, 80 * mib)) == 8 * mib, "an older run is ignored"
        assert position_after(os.urandom(4096)) <= 80 * mib
    finally:
        parent.stop()
    assert not parent.reader._thread.is_alive()
    with pytest.raises(OSError):
        os.fstat(parent.reader.descriptor)  # closed by its thread


def test_verify_of_a_large_file_is_read_ahead_by_the_calling_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file past the read-ahead threshold: the parent reads it, the sandboxed child paces it, the run passes."""
    from trt_inline.isolation import read_ahead

    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(18))).eval()  # 72 MiB
    x = torch.randn(2, 1024)
    compiled = trt_inline.reference.compile(model, (x,))
    path = tmp_path / "large.pt2"
    trt_inline.save(compiled, path, arg_inputs=(x,))
    assert path.stat().st_size >= read_ahead.READ_AHEAD_FROM
    with caplog.at_level(logging.INFO, logger="trt_inline.progress"):
        report = trt_inline.verify(path)
    assert report.ok and report.outputs and max(o.max_abs_diff for o in report.outputs) == 0.0, report
    messages = [r.getMessage() for r in caplog.records if r.name == "trt_inline.progress"]
    assert any("reading it ahead of the child" in m for m in messages), messages
    assert any("pacing the calling process's reading ahead of the program" in m for m in messages), messages


def test_the_parent_reads_ahead_only_a_regular_file(tmp_path: Path) -> None:
    """A FIFO put where the file was: refused at once, never waited on (the child then says what is wrong)."""
    from trt_inline.isolation import read_ahead

    fifo = tmp_path / "model.pt2"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        read_ahead.FeedReader(str(fifo), 1 << 30)
    assert isolation.child._feed_reader(str(fifo)) is None
