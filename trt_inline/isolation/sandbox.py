"""The operating-system sandbox around a child process that opens a file from a stranger.

Wall two of verification (README, "Threat model"): assume that code from the
file runs in the child anyway, and keep it from reaching anything outside. The
child applies the sandbox to itself, after its imports and before it reads a
byte of the file, in three layers:

==================  ===================================================================
layer               what it takes away
==================  ===================================================================
namespaces          (where unprivileged user namespaces are allowed) a user, PID,
                    network and IPC namespace of its own: no network interface but a
                    loopback nobody else is on, and the job runs as the first process
                    of its PID namespace, so everything in it dies with it (no PID
                    namespace where CUDA runs: see below)
Landlock            every file but the Python installation (read), the job's private
                    folder (read and write) and what a job is given; TCP bind and
                    connect; signals and abstract UNIX sockets outside the sandbox
seccomp-bpf         ``execve``, new processes (``clone`` without ``CLONE_THREAD``,
                    ``fork``, ``vfork``), ``ptrace``, signals to other processes,
                    other processes' limits, priorities and scheduling,
                    sockets, leaving its process group, namespaces, mounts, BPF,
                    ``io_uring``, keyrings, kernel modules, terminal injection
==================  ===================================================================

Landlock and seccomp need no privilege (``no_new_privs``); they are the walls
:func:`required` asks for. Namespaces are added where the system allows them
(some distributions restrict unprivileged user namespaces): every wall of the
table holds without them, since seccomp alone already refuses sockets and new
processes. seccomp goes through libseccomp (the ``pyseccomp`` binding), which
compiles the filter for the machine's architecture; Landlock and namespaces are
three system calls each, made here through ``ctypes``.

Where the job may use CUDA (``Policy.devices``: the machine has NVIDIA devices
and they are not hidden), the driver must start inside the walls: Landlock also
grants the device files (read, write, ioctl), what the driver reads about the
devices, the kernel module and the machine's memory, and writing the files of
this process's own threads (the driver names its threads through
``/proc/self/task/<tid>/comm`` and fails with error 304 where it cannot); and
there is no PID namespace, whose thread ids would not match the system's
``/proc``; seccomp refuses acting on other processes by pid (their limits, priorities, scheduling) here
as everywhere. SECURITY.md lists each grant and why it opens no
way out. Nothing may start CUDA before :func:`enter`: entering forks, and torch
refuses CUDA in a process forked after it started (:func:`cuda_devices_visible`
asks without starting it).

Nothing here imports torch: :func:`enter` runs in a child that has imported it
already, and :func:`status` is cheap.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import sys
import sysconfig
import termios
from dataclasses import dataclass, field
from pathlib import Path

from trt_inline.errors import SandboxUnavailable

__all__ = ["Applied", "Policy", "SandboxUnavailable", "Status", "cuda_devices_visible", "enter", "status"]


@dataclass(frozen=True)
class Policy:
    """What one job may reach.

    ``private``: its own folder, the only place it may write. ``readable``: files
    or folders it may also read (a package whose native code the user allowed).
    ``loopback``: a network namespace whose only interface is loopback, and TCP on
    it (a rank set's collectives); needs namespaces. ``devices``: the GPU's device
    files. ``namespaces``: use them where the system allows (tests turn this off
    to check the walls without them). ``writable``: folders it may also write
    (a loader of native code the user allowed that writes where ``TMPDIR`` does
    not say).
    """

    private: Path
    readable: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    loopback: bool = False
    devices: bool = False
    namespaces: bool = True


@dataclass
class Applied:
    """What :func:`enter` set up, in words for a report."""

    layers: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def describe(self) -> str:
        text = ", ".join(self.layers)
        return text + (f" ({'; '.join(self.missing)})" if self.missing else "")


# ---------------------------------------------------------------------------
# System calls
# ---------------------------------------------------------------------------

_CLONE_THREAD = 0x00010000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)


def _call(function: str, *arguments: object) -> int:
    """A libc function returning -1 on failure; raises OSError with its errno."""
    ctypes.set_errno(0)
    result = int(getattr(_libc, function)(*arguments))
    if result == -1:
        number = ctypes.get_errno()
        raise OSError(number, f"{function}: {os.strerror(number)}")
    return result


def _syscall(number: int, *arguments: object) -> int:
    return _call("syscall", ctypes.c_long(number), *arguments)


# ---------------------------------------------------------------------------
# Landlock (Linux 5.13+): three system calls with the same numbers on every architecture
# ---------------------------------------------------------------------------

_LANDLOCK_CREATE_RULESET = 444
_LANDLOCK_ADD_RULE = 445
_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1

_FS_EXECUTE = 1 << 0
_FS_WRITE_FILE = 1 << 1
_FS_READ_FILE = 1 << 2
_FS_READ_DIR = 1 << 3
_FS_REMOVE_DIR = 1 << 4
_FS_REMOVE_FILE = 1 << 5
_FS_MAKE_CHAR = 1 << 6
_FS_MAKE_DIR = 1 << 7
_FS_MAKE_REG = 1 << 8
_FS_MAKE_SOCK = 1 << 9
_FS_MAKE_FIFO = 1 << 10
_FS_MAKE_BLOCK = 1 << 11
_FS_MAKE_SYM = 1 << 12
_FS_REFER = 1 << 13  # ABI 2
_FS_TRUNCATE = 1 << 14  # ABI 3
_FS_IOCTL_DEV = 1 << 15  # ABI 5
_NET_BIND_TCP = 1 << 0  # ABI 4
_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
_SCOPE_SIGNAL = 1 << 1

# Rights a rule on a file (rather than a folder) may carry.
_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
_READ = _FS_READ_FILE | _FS_READ_DIR
_READ_WRITE = (
    _READ | _FS_WRITE_FILE | _FS_TRUNCATE | _FS_REMOVE_DIR | _FS_REMOVE_FILE | _FS_MAKE_DIR | _FS_MAKE_REG
    | _FS_MAKE_FIFO | _FS_MAKE_SYM | _FS_REFER
)  # fmt: skip


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed: a u64 then an s32
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers; 0 where it has none (or it is disabled)."""
    try:
        return _syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except OSError:
        return 0


def _fs_rights(abi: int) -> int:
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= _FS_REFER
    if abi >= 3:
        rights |= _FS_TRUNCATE
    if abi >= 5:
        rights |= _FS_IOCTL_DEV
    return rights


_pinned: list[int] = []


def _landlock(rules: dict[str, int], abi: int, *, loopback: bool) -> None:
    """Restrict this process to ``rules`` ({path: rights}); TCP only on loopback-only namespaces."""
    handled = _fs_rights(abi)
    attribute = _RulesetAttr(handled, 0, 0)
    size = 8
    if abi >= 4 and not loopback:
        attribute.net = _NET_BIND_TCP | _NET_CONNECT_TCP  # no rule: every TCP bind and connect refused
        size = 16
    if abi >= 6:
        attribute.scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | (0 if loopback else _SCOPE_SIGNAL)
        size = 24
    ruleset = _syscall(_LANDLOCK_CREATE_RULESET, ctypes.byref(attribute), ctypes.c_size_t(size), ctypes.c_uint32(0))
    try:
        for path, rights in sorted(rules.items()):
            try:
                descriptor = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # not on this system
            try:
                allowed = rights & handled
                if not os.path.isdir(path):
                    allowed &= _FILE_RIGHTS
                if allowed:
                    rule = _PathBeneath(allowed, descriptor)
                    _syscall(
                        _LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH),
                        ctypes.byref(rule), ctypes.c_uint32(0),
                    )  # fmt: skip
            finally:
                if path.startswith("/proc/self"):
                    # Kept open: procfs makes a new inode for a path whose entry it dropped, and a rule
                    # holds the inode it was given; an open descriptor keeps the entry, so the rule holds.
                    _pinned.append(descriptor)
                else:
                    os.close(descriptor)
        _call("prctl", _PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
        _syscall(_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)


def _python_paths() -> set[str]:
    """What the interpreter may still need to read: its installation, imported packages, loaded libraries."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(KeyError):
            paths.add(sysconfig.get_path(key))
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or not os.path.isabs(file):
            continue
        # A package's top folder (lazy submodule imports), or a single-file module itself.
        top = sys.modules.get(name.partition(".")[0])
        locations = [p for p in getattr(top, "__path__", None) or [] if isinstance(p, str)]
        paths.update(locations or [file])
    with contextlib.suppress(OSError), open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/"):
                paths.add(os.path.dirname(parts[5].strip()))
    return {path for path in paths if path and path != "/"}


def cuda_devices_visible() -> bool:
    """Whether this machine has NVIDIA devices a CUDA program here may use, asked without starting CUDA.

    Starting CUDA before :func:`enter` would break the job: entering forks, and torch refuses CUDA in a
    process forked after it was started. ``CUDA_VISIBLE_DEVICES`` set empty (or to ``-1``) hides them.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and (not visible.strip() or visible.strip().startswith("-1")):
        return False
    return os.path.exists("/dev/nvidiactl")


def _rules(policy: Policy) -> dict[str, int]:
    rules = dict.fromkeys(_python_paths(), _READ)
    rules.update(dict.fromkeys(policy.readable, _READ))
    rules.update(dict.fromkeys(policy.writable, _READ_WRITE))
    rules.update({"/dev/null": _FS_READ_FILE | _FS_WRITE_FILE, "/etc/ld.so.cache": _FS_READ_FILE})
    rules.update(dict.fromkeys(("/dev/urandom", "/dev/random", "/dev/zero", "/proc/cpuinfo"), _FS_READ_FILE))
    rules.update({"/proc/self": _READ, "/sys/devices/system/cpu": _READ, str(policy.private): _READ_WRITE})
    if policy.devices:
        rules.update(_cuda_rules())
    return rules


def _cuda_rules() -> dict[str, int]:
    """What the CUDA driver (and TensorRT) reach while it starts and runs; SECURITY.md says why each is safe.

    The device files, opened read-write with ioctls; what the driver reads about the devices, the
    kernel module and the machine's memory; and the files of this process's own threads (the driver,
    570 and newer, names its threads through them while it starts, failing with error 304, "OS call
    failed", where it cannot). Not ``/dev/shm``: without a mount namespace of its own it is the
    machine's, where other processes keep their shared memory.
    """
    device = _FS_READ_FILE | _FS_WRITE_FILE | _FS_IOCTL_DEV
    rules = {f"/dev/{name}": device for name in os.listdir("/dev") if name.startswith("nvidia")}
    folders = (
        "/proc/driver/nvidia", "/proc/driver/nvidia-uvm", "/proc/driver/nvidia-caps", "/sys/bus/pci",
        "/sys/devices", "/sys/module/nvidia", "/sys/module/nvidia_uvm", "/proc/sys/vm",
    )  # fmt: skip
    rules.update(dict.fromkeys(folders, _READ))
    rules.update(dict.fromkeys(("/proc/devices", "/proc/meminfo", "/proc/modules"), _FS_READ_FILE))
    rules["/proc/self/task"] = _READ | _FS_WRITE_FILE
    return rules


def _load_cuda_driver() -> None:
    """Load the CUDA driver's library now (without starting CUDA: no cuInit), so that its folder, wherever the
    system keeps it, is among the mapped libraries the sandbox lets the job read."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libcuda.so.1")


# ---------------------------------------------------------------------------
# seccomp-bpf through libseccomp
# ---------------------------------------------------------------------------

# Refused outright (EPERM): programs, other processes, the kernel's larger surfaces.
_REFUSED_SYSCALLS = (
    "execve", "execveat", "fork", "vfork", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open",
    "pidfd_getfd", "pidfd_send_signal", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "tkill", "setsid", "setpgid",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsmount",
    "fsconfig", "fspick", "mount_setattr", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "open_by_handle_at", "name_to_handle_at", "process_madvise",
    "kcmp", "personality", "ioperm", "iopl", "acct", "swapon", "swapoff", "reboot", "syslog", "quotactl",
)  # fmt: skip
_SOCKET_SYSCALLS = ("socket", "socketpair")
# System calls that act on the process their first argument names: refused unless it names the caller (0).
_OWN_PROCESS_ONLY = (
    "prlimit64", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr", "migrate_pages",
    "move_pages", "get_robust_list",
)  # fmt: skip
_PRIO_PROCESS = 0
_IOPRIO_WHO_PROCESS = 1


def _seccomp_module() -> object:
    import pyseccomp

    return pyseccomp


def _seccomp(loopback: bool) -> None:
    """Load the filter: refused system calls fail with EPERM; everything else (torch needs much) is allowed."""
    seccomp = _seccomp_module()
    denied = seccomp.ERRNO(errno.EPERM)  # type: ignore[attr-defined]
    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)  # type: ignore[attr-defined]
    if seccomp.system_arch() == seccomp.Arch.X86_64:  # type: ignore[attr-defined]
        rules.add_arch(seccomp.Arch.X32)  # type: ignore[attr-defined]  # the same rules for x32 system calls
    rules.set_attr(seccomp.Attr.CTL_TSYNC, 1)  # type: ignore[attr-defined]
    for name in _REFUSED_SYSCALLS:
        with contextlib.suppress(Exception):  # a name this architecture does not have
            rules.add_rule(denied, name)
    arg = seccomp.Arg  # type: ignore[attr-defined]
    # New processes: clone without CLONE_THREAD (threads stay allowed); clone3 hides its flags, so
    # it says ENOSYS and the C library falls back to clone.
    rules.add_rule(denied, "clone", arg(0, seccomp.MASKED_EQ, _CLONE_THREAD, 0))  # type: ignore[attr-defined]
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")  # type: ignore[attr-defined]
    # Signals only to itself (its threads included).
    own = os.getpid()
    rules.add_rule(denied, "kill", arg(0, seccomp.NE, own))  # type: ignore[attr-defined]
    rules.add_rule(denied, "tgkill", arg(0, seccomp.NE, own))  # type: ignore[attr-defined]
    # Other processes' limits, priorities, scheduling and memory placement: only its own (0: the caller). A PID
    # namespace hides the other processes too; where there is none (no namespaces, or CUDA), these hold.
    for name in _OWN_PROCESS_ONLY:
        with contextlib.suppress(Exception):  # a name this architecture does not have
            rules.add_rule(denied, name, arg(0, seccomp.NE, 0))  # type: ignore[attr-defined]
    for name, which in (("setpriority", _PRIO_PROCESS), ("ioprio_set", _IOPRIO_WHO_PROCESS)):
        rules.add_rule(denied, name, arg(0, seccomp.NE, which))  # type: ignore[attr-defined]
        rules.add_rule(denied, name, arg(1, seccomp.NE, 0))  # type: ignore[attr-defined]
    rules.add_rule(denied, "ioctl", arg(1, seccomp.EQ, termios.TIOCSTI))  # type: ignore[attr-defined]
    if not loopback:
        for name in _SOCKET_SYSCALLS:
            rules.add_rule(denied, name)
    rules.load()


# ---------------------------------------------------------------------------
# Namespaces
# ---------------------------------------------------------------------------


def _relay(child: int) -> None:
    """In the process that forked ``child``: end as it ends (its exit code, or its signal). Never returns."""
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _fork_and_follow() -> None:
    """Fork; the parent waits and ends as the child does, the child returns. The child dies with its parent."""
    child = os.fork()
    if child:
        _relay(child)
    _call(
        "prctl",
        _PR_SET_PDEATHSIG,
        ctypes.c_ulong(signal.SIGKILL),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
    )


def _single_threaded() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def _namespaces(loopback: bool, pid: bool) -> str | None:
    """Enter new user, network and IPC namespaces, and with ``pid`` a PID namespace whose first process it
    becomes; why not, or None.

    Must be single-threaded (unshare refuses a new user namespace otherwise): a
    multi-threaded caller forks first. Returns in the process that runs the job.
    """
    if not _single_threaded():
        _fork_and_follow()
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWUSER | _CLONE_NEWNET | _CLONE_NEWIPC | (_CLONE_NEWPID if pid else 0)
    try:
        _call("unshare", ctypes.c_int(flags))
        # The same user inside as outside, so that files it creates belong to it.
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    except OSError as exc:
        return f"namespaces unavailable: {exc.strerror or exc}"
    if pid:
        _fork_and_follow()  # the first process of the new PID namespace: everything in it dies with it
    if loopback:
        _loopback_up()
    return None


def _loopback_up() -> None:
    """Bring up ``lo`` in this network namespace (a rank set's collectives talk over it)."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, siocgifflags, request + bytes(22))[:18])[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sH", b"lo", flags | iff_up) + bytes(22))


def _drop_capabilities() -> None:
    """Give up the capabilities a new user namespace grants: nothing in the job needs one."""

    class _Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class _Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header = _Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two data structs
    data = (_Data * 2)()
    _call("capset", ctypes.byref(header), data)


# ---------------------------------------------------------------------------
# Status and entry
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Status:
    """What this system offers the sandbox (asked without entering it)."""

    landlock_abi: int
    seccomp: str | None  # None: available; otherwise why not

    @property
    def missing(self) -> list[str]:
        """The walls :func:`enter` needs and cannot set up here."""
        missing = []
        if self.landlock_abi < 1:
            missing.append("Landlock (Linux 5.13 or newer, enabled in the kernel's LSM list)")
        if self.seccomp is not None:
            missing.append(f"seccomp ({self.seccomp})")
        return missing


def status() -> Status:
    """Whether the walls the sandbox needs exist here; namespaces are tried when a child enters it."""
    if not sys.platform.startswith("linux"):
        return Status(0, f"not Linux ({sys.platform})")
    try:
        _seccomp_module()
        seccomp: str | None = None
    except Exception as exc:  # pyseccomp raises RuntimeError without libseccomp
        seccomp = f"libseccomp not usable: {exc}"
    return Status(landlock_abi(), seccomp)


def enter(policy: Policy) -> Applied:
    """Sandbox this process (namespaces where allowed, then Landlock and seccomp); what was set up.

    May fork: the process that returns is the one to run the job in; the others
    only wait and end as it ends. Raises :class:`SandboxUnavailable` when
    Landlock or seccomp cannot be set up, before anything is restricted.
    """
    found = status()
    if found.missing:
        raise SandboxUnavailable("this system lacks " + " and ".join(found.missing))
    applied = Applied()
    # No PID namespace where CUDA runs: /proc stays the system's, and the driver names its threads through
    # /proc/self/task/<tid>, by the thread ids it sees, which a PID namespace of its own would renumber.
    pid = not policy.devices
    why_not = _namespaces(policy.loopback, pid) if policy.namespaces else "namespaces not asked for"
    if why_not is None:
        applied.layers.append(f"user, {'PID, ' if pid else ''}network and IPC namespaces")
        with contextlib.suppress(OSError):
            _drop_capabilities()
    elif policy.loopback:
        raise SandboxUnavailable(f"a rank set's loopback network needs namespaces ({why_not})")
    else:
        applied.missing.append(why_not)
    if policy.devices:
        _load_cuda_driver()
    _landlock(_rules(policy), found.landlock_abi, loopback=policy.loopback)
    applied.layers.append(f"Landlock ABI {found.landlock_abi}")
    _seccomp(policy.loopback)
    applied.layers.append("seccomp")
    return applied
