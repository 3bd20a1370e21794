"""Assume breach: code running inside the sandboxed child reaches nothing outside it.

However code got into the child (a bug in torch's loader, in an allowed
operator's native code), these tests run it there on purpose, through a job
only the tests register (``tests/support/breach_probe.py``), and check from outside
that every attempt failed: files, network, programs, processes, signals, the
parent, other jobs. They run on a fresh interpreter (as the ``trt-inline``
command does) and forked from a reused one, with and without namespaces (the
walls a system without unprivileged user namespaces still has).
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.breach_probe import BreachRequest, EnvironmentRequest
from support.processes import REPO, new_interpreter
from support.programs import SavedSeed

import trt_inline
from trt_inline import cli
from trt_inline.errors import IsolationError
from trt_inline.isolation import Limits, reusing_interpreter, run_isolated, sandbox

pytestmark = [
    pytest.mark.skipif(
        bool(sandbox.status().missing), reason=f"this system cannot set up the sandbox: {sandbox.status().missing}"
    ),
    pytest.mark.usefixtures("fresh_children"),  # the path the trt-inline command takes, unless a test says otherwise
]

_CONTAINED = (
    "read a secret file outside",
    "list the folder the secret is in",
    "write a file outside",
    "change a file outside",
    "delete a file outside",
    "rewrite another job's request",
    "read the home folder",
    "connect to a listener on 127.0.0.1",
    "connect to a UNIX socket",
    "execve /bin/sh",
    "fork a process that outlives the job",
    "spawn a program",
    "signal the parent",
    "ptrace the parent",
    "read the parent's memory",
    "read the parent's environment",
    "leave its process group",
    "lower the parent's limits",
    "renice every process of its user",
)
_STILL_WORKING = ("write its own folder", "start a thread", "compute with torch")


@dataclass
class Outside:
    """What lies outside the child: a secret, a victim, another job's request, listeners, a marker path."""

    root: Path
    secret: Path
    victim: Path
    other_request: Path
    marker: Path
    port: int
    unix_socket: Path
    knocks: list[bytes]

    def arguments(self) -> dict[str, object]:
        return {
            "parent": os.getpid(),
            "secret": str(self.secret),
            "outside": str(self.root / "outside.txt"),
            "victim": str(self.victim),
            "other_request": str(self.other_request),
            "marker": str(self.marker),
            "port": self.port,
            "unix_socket": str(self.unix_socket),
            "home": str(Path.home()),
        }


def _serve(server: socket.socket, knocks: list[bytes]) -> None:
    """Accept connections until the socket closes, keeping what each sent."""
    while True:
        try:
            connection, _ = server.accept()
        except OSError:
            return
        with connection:
            connection.settimeout(1)
            try:
                knocks.append(connection.recv(64))
            except OSError:
                knocks.append(b"?")


@pytest.fixture
def outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Outside]:
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cr3t")
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # the jobs' private folders go here
    other = Path(tempfile.mkdtemp(prefix="trt-inline-"))
    (other / "request.json").write_text('{"job": "verify"}')
    knocks: list[bytes] = []
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    unix = socket.socket(socket.AF_UNIX)
    unix_path = tmp_path / "listener.sock"
    unix.bind(str(unix_path))
    unix.listen()
    for server in (tcp, unix):
        threading.Thread(target=_serve, args=(server, knocks), daemon=True).start()
    yield Outside(
        tmp_path, secret, victim, other / "request.json", tmp_path / "marker", tcp.getsockname()[1], unix_path, knocks
    )
    tcp.close()
    unix.close()


def _probe(outside: Outside, *, namespaces: bool) -> dict[str, str]:
    result = run_isolated(
        BreachRequest(outside.arguments()), None, Limits(120, 2 << 30), where="probe", namespaces=namespaces
    )
    assert result.sandbox is not None and "seccomp" in result.sandbox and "Landlock" in result.sandbox
    assert ("namespaces" in result.sandbox.split("(")[0]) is namespaces, result.sandbox
    return dict(result.value)


def _assert_contained(outside: Outside, *probed: dict[str, str]) -> None:
    for results in probed:
        escaped = {n: results.get(n) for n in _CONTAINED if not str(results.get(n, "")).startswith("blocked")}
        assert escaped == {}, escaped
        broken = {name: results.get(name) for name in _STILL_WORKING if results.get(name) != "SUCCEEDED"}
        assert broken == {}, broken
        # The request came over a pipe: nothing in the job's folder but what the job itself wrote.
        assert "request" not in results["own folder holds"], results["own folder holds"]
    time.sleep(1.5)  # what a lingering process would have waited before writing the marker (after the last probe)
    assert not outside.marker.exists(), outside.marker.read_text()
    assert outside.victim.read_text() == "untouched"
    assert not (outside.root / "outside.txt").exists()
    assert outside.other_request.read_text() == '{"job": "verify"}'
    assert outside.knocks == []
    assert _processes_mentioning(str(outside.marker)) == []


def _processes_mentioning(text: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", text], capture_output=True, text=True).stdout.split()


@pytest.mark.parametrize("namespaces", [True, False], ids=["namespaces", "no-namespaces"])
def test_code_in_a_fresh_child_reaches_nothing_outside(outside: Outside, namespaces: bool) -> None:
    results = _probe(outside, namespaces=namespaces)
    _assert_contained(outside, results)


def test_code_in_a_forked_child_reaches_nothing_outside(outside: Outside) -> None:
    with reusing_interpreter():
        first = _probe(outside, namespaces=True)
        second = _probe(outside, namespaces=False)
    _assert_contained(outside, first, second)


def test_the_child_gets_no_secret_from_the_environment(outside: Outside, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only variables that configure Python, torch and devices reach a child: no token of the caller's."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-from-the-environment")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    seen = run_isolated(EnvironmentRequest(), None, Limits(120, 2 << 30), where="probe").value
    assert "AWS_SECRET_ACCESS_KEY" not in seen and "s3cr3t-from-the-environment" not in str(seen)
    assert seen["OMP_NUM_THREADS"] == "2"
    assert seen["TMPDIR"].startswith(str(outside.root)), seen["TMPDIR"]


def test_a_system_without_the_sandbox_refuses_unless_told(
    saved_seed: SavedSeed, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where Landlock or seccomp is missing, verify exits 2 saying so; --no-sandbox runs, and the report says so."""
    monkeypatch.setattr(sandbox, "status", lambda: sandbox.Status(0, "not on this system"))
    assert cli.main(["verify", str(saved_seed.good)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the OS sandbox that opens files from strangers cannot be set up" in err
    assert "--no-sandbox" in err
    with pytest.raises(IsolationError, match="Landlock"):
        trt_inline.verify(saved_seed.good)
    assert cli.main(["verify", str(saved_seed.good), "--no-sandbox"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PASS") and "WITHOUT the OS sandbox (--no-sandbox)" in out


def test_doctor_shows_the_sandbox() -> None:
    proc = new_interpreter("-m", "trt_inline", "doctor", cwd=REPO, timeout=300)
    line = next(line for line in proc.stdout.splitlines() if line.startswith("sandbox"))
    assert "Landlock ABI" in line and "seccomp" in line, proc.stdout
