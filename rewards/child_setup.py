"""The start of an isolated child process (reward scoring, environments): tie its life to the parent's,
take the parent's sys.path and imports, load what it serves, and say ready or why not."""

import ctypes
import importlib
import logging
import signal
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

_PR_SET_PDEATHSIG = 1


def connect(fd: int, name: str, load: Callable[..., tuple[Any, Any]]) -> tuple[Connection, Any] | None:
    """Answer the parent's ``("init", sys_path, imports, *arguments)`` on socket `fd`: ``load(*arguments)``
    returns (what the child serves, the payload of its ``("ready", payload)``). Returns the connection and
    what was loaded, or None after reporting ``("init_error", message)``."""
    # Die with the reward worker even while stuck in user code (libc prctl; not in the stdlib).
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    logging.basicConfig(level=logging.WARNING, format=f"{name} child: %(levelname)s %(name)s: %(message)s")
    connection = Connection(fd)
    _, sys_path, imports, *arguments = connection.recv()
    sys.path[:0] = [entry for entry in sys_path if entry not in sys.path]
    try:
        for module in imports:
            importlib.import_module(module)
        loaded, payload = load(*arguments)
    except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it
        connection.send(("init_error", f"{type(error).__name__}: {error}"))
        return None
    connection.send(("ready", payload))
    return connection, loaded
