"""The isolated child process of a reward worker (``python -m rewards.child FD``).

Protocol over the socket ``FD`` (``multiprocessing.connection`` framing, pickled tuples):

    parent -> child  ("init", sys_path, imports, [(name, ref, kwargs), ...], timeout_s)
    child -> parent  ("ready", [one_unit_per_group, ...])  or  ("init_error", message)
    parent -> child  ("score", prompt, completions, metadata, first_unit)
    child -> parent  ("unit", index, [outcome, ...])  for each unit from first_unit on

The child imports the reward functions once, then serves groups until the socket closes.
"""

import asyncio
import ctypes
import importlib
import logging
import signal
import sys
from multiprocessing.connection import Connection

from rewards.scoring import Group, load_components, plan_units, run_unit

_PR_SET_PDEATHSIG = 1


def main(fd: int) -> None:
    # Die with the reward worker even while stuck in user code (libc prctl; not in the stdlib).
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    logging.basicConfig(level=logging.WARNING, format="reward child: %(levelname)s %(name)s: %(message)s")
    connection = Connection(fd)
    _, sys_path, imports, functions, timeout_s = connection.recv()
    sys.path[:0] = [entry for entry in sys_path if entry not in sys.path]
    try:
        for module in imports:
            importlib.import_module(module)
        components = load_components(functions)
    except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it
        connection.send(("init_error", f"{type(error).__name__}: {error}"))
        return
    connection.send(("ready", [component.one_unit_per_group for component in components]))
    loop = asyncio.new_event_loop()
    while True:
        try:
            _, prompt, completions, metadata, first_unit = connection.recv()
        except EOFError:
            return
        group = Group(prompt, completions, metadata)
        units = plan_units([c.one_unit_per_group for c in components], len(completions))
        for index in range(first_unit, len(units)):
            unit = units[index]
            outcomes = run_unit(components[unit.component], unit, group, timeout_s, loop)
            connection.send(("unit", index, outcomes))


if __name__ == "__main__":
    main(int(sys.argv[1]))
