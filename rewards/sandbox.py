"""Run untrusted Python in a subprocess with CPU, memory, process, file-size and wall-clock limits.

Isolation, strongest first, all set up before the untrusted interpreter starts:
- ``resource.setrlimit``: RLIMIT_CPU (CPU seconds), RLIMIT_AS (address space), RLIMIT_NPROC
  (processes, which stops fork bombs), RLIMIT_FSIZE (bytes per written file, also caps the
  captured stdout/stderr, which go to files).
- When started as root the code runs as an unprivileged user (``nobody``): root ignores
  RLIMIT_NPROC, and an unprivileged user cannot write the project's files.
- ``unshare --user --net --pid --fork --kill-child`` (util-linux): a private network namespace
  with no usable interface (no network, loopback included) and a private PID namespace whose
  processes the kernel kills as soon as the sandbox ends (no escaped daemons or zombies).
  Where ``unshare`` is missing or not permitted this falls back, with a warning, to limits only
  plus proxy variables pointing at a dead port: that stops well-behaved HTTP clients but not raw
  sockets, and background processes that leave the process group survive until their CPU limit.
- A temporary working directory, removed afterwards; the wall-clock timeout kills the process
  group; the launcher dies with its parent (PR_SET_PDEATHSIG).

No Python runs between fork and exec (no ``preexec_fn``): the caller may be multithreaded (JAX, gRPC,
Ray), and a forked copy of a threaded process that runs Python can deadlock on a lock another thread
held. The user switch is ``Popen``'s own (done in C), and the limits and the parent-death signal are
set by a small launcher (`_LAUNCHER`), the first program the child executes, which then executes the
rest of the command.
Not isolated: the rest of the file system stays readable (and world-writable places writable);
RLIMIT_NPROC counts every process of the sandbox user, so concurrent sandboxes share it on
kernels older than 5.14 (newer kernels count per user namespace).
"""

import functools
import json
import logging
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SANDBOX_UID = 65534  # "nobody"
_NAMESPACES = ("unshare", "--user", "--net", "--pid", "--fork", "--kill-child", "--")
_DEAD_PROXY = "http://127.0.0.1:9"
# argv: [limits as JSON [[kind, value], ...], the parent's pid, command...]. Soft = hard: at the hard CPU
# limit the kernel sends SIGKILL, which also ends a namespace's init (pid 1 ignores the soft limit's
# SIGXCPU). The death signal is set after the user switch (which clears it); a parent that died before
# it was set is caught by the pid check. prctl is not in the standard library: libc's is called.
_LAUNCHER = """import ctypes, json, os, resource, signal, sys
for kind, value in json.loads(sys.argv[1]):
    resource.setrlimit(kind, (value, value))
ctypes.CDLL(None).prctl(1, signal.SIGKILL)
if os.getppid() != int(sys.argv[2]):
    sys.exit(125)
os.execvp(sys.argv[3], sys.argv[3:])
"""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run."""

    timeout_s: float = 5.0  # wall clock
    cpu_s: int | None = None  # RLIMIT_CPU; None = ceil(timeout_s)
    memory_mb: int = 1024  # RLIMIT_AS
    max_processes: int = 32  # RLIMIT_NPROC, the launcher included
    max_file_mb: int = 16  # RLIMIT_FSIZE
    max_output_chars: int = 65536  # of stdout and stderr each, kept for the caller
    namespaces: bool = True  # use unshare when it works

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.memory_mb <= 0 or self.max_processes < 2 or self.max_file_mb <= 0:
            raise ValueError(f"invalid sandbox limits: {self}")


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed run did."""

    returncode: int  # 0 = success; a kill shows as -signal (or as 1 when it hit unshare's child)
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def run_python(source: str, stdin: str = "", limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run ``source`` as a Python script in the sandbox, feeding ``stdin``; never raises for
    anything the code does (only when the sandbox itself cannot start)."""
    drop_privileges = os.geteuid() == 0
    workdir = Path(tempfile.mkdtemp(prefix="tandem-sandbox-"))
    try:
        (workdir / "main.py").write_text(source)
        (workdir / "stdin.txt").write_text(stdin)
        if drop_privileges:
            for path in (workdir, workdir / "main.py"):
                os.chown(path, SANDBOX_UID, SANDBOX_UID)
        prefix = list(_NAMESPACES) if limits.namespaces and _namespaces_work(drop_privileges) else []
        command = [*prefix, _interpreter(drop_privileges), "-I", "main.py"]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(workdir), "LANG": "C.UTF-8"}
        if not prefix:
            env |= {name: _DEAD_PROXY for name in ("http_proxy", "https_proxy", "all_proxy",
                                                   "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")}
        with (
            open(workdir / "stdin.txt", "rb") as stdin_file,
            tempfile.TemporaryFile() as out_file,
            tempfile.TemporaryFile() as err_file,
        ):
            start = time.monotonic()
            process = subprocess.Popen(
                _confined(command, limits, drop_privileges), cwd=workdir, env=env, stdin=stdin_file,
                stdout=out_file, stderr=err_file, start_new_session=True, **_user(drop_privileges),
            )
            try:
                process.wait(timeout=limits.timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
                _stop(process, in_namespace=bool(prefix))
            if not prefix:
                _kill_group(process.pid)  # whatever the code left running in its group
            returncode = process.wait()
            wall_s = time.monotonic() - start
            stdout, stderr = _read(out_file, limits), _read(err_file, limits)
            return SandboxResult(returncode, stdout, stderr, timed_out, wall_s)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _confined(command: list[str], limits: SandboxLimits, drop_privileges: bool) -> list[str]:
    """`command` behind the launcher that sets the limits and the parent-death signal, then executes it."""
    cpu_s = limits.cpu_s if limits.cpu_s is not None else max(1, int(-(-limits.timeout_s // 1)))
    rlimits = [
        (resource.RLIMIT_CPU, cpu_s),
        (resource.RLIMIT_AS, limits.memory_mb << 20),
        (resource.RLIMIT_NPROC, limits.max_processes),
        (resource.RLIMIT_FSIZE, limits.max_file_mb << 20),
        (resource.RLIMIT_CORE, 0),
    ]
    return [_interpreter(drop_privileges), "-I", "-S", "-c", _LAUNCHER, json.dumps(rlimits), str(os.getpid()),
            *command]


def _user(drop_privileges: bool) -> dict[str, object]:
    """Popen's arguments that run the child as the unprivileged sandbox user (set in C, before exec)."""
    return {"user": SANDBOX_UID, "group": SANDBOX_UID, "extra_groups": []} if drop_privileges else {}


def _stop(process: subprocess.Popen, in_namespace: bool) -> None:
    """Kill a sandbox that ran out of time, and wait until its processes are gone.

    With namespaces the target is the namespace's init (unshare's child): the kernel then kills
    every process of the namespace before that init exits, and ``unshare`` reaps it and exits.
    Killing ``unshare`` instead would orphan the namespace to the host's init, whose late reaping
    leaves zombies counting against the sandbox user's RLIMIT_NPROC.
    """
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
    if in_namespace and children.exists():
        for pid in children.read_text().split():
            _kill(int(pid))
        try:
            process.wait(timeout=5.0)
            return
        except subprocess.TimeoutExpired:
            pass
    _kill_group(process.pid)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read(file, limits: SandboxLimits) -> str:
    file.seek(0)
    return file.read(limits.max_output_chars).decode(errors="replace")


@functools.cache
def _namespaces_work(drop_privileges: bool) -> bool:
    """Whether ``unshare`` can make the namespaces here (checked once per process)."""
    if shutil.which("unshare") is None:
        log.warning("sandbox: 'unshare' not found; running code without network/PID namespaces")
        return False
    probe = subprocess.run(_confined([*_NAMESPACES, "true"], SandboxLimits(), drop_privileges),
                           capture_output=True, timeout=30, **_user(drop_privileges))
    if probe.returncode != 0:
        log.warning("sandbox: unshare failed (%s); running code without network/PID namespaces",
                    probe.stderr.decode(errors="replace").strip())
    return probe.returncode == 0


@functools.cache
def _interpreter(drop_privileges: bool) -> str:
    """A Python the sandbox user can run: this one, or (when it lies in a private directory such
    as root's home) the system's."""
    candidates = [sys.executable]
    if drop_privileges:
        candidates += [shutil.which(name, path="/usr/local/bin:/usr/bin:/bin") or "" for name in ("python3",)]
    for candidate in candidates:
        if candidate and (not drop_privileges or _world_executable(Path(candidate))):
            return candidate
    raise RuntimeError(f"no Python interpreter usable by uid {SANDBOX_UID}; tried {candidates}")


def _world_executable(path: Path) -> bool:
    """Whether any user may execute ``path`` (every directory on its real path searchable by others)."""
    real = path.resolve()
    if not real.is_file() or not real.stat().st_mode & stat.S_IXOTH:
        return False
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in real.parents)
