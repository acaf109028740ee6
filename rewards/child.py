"""The isolated child process of a reward worker (``python -m rewards.child FD``).

Protocol over the socket ``FD`` (``multiprocessing.connection`` framing, pickled tuples):

    parent -> child  ("init", sys_path, imports, [(name, ref, kwargs), ...], timeout_s)
    child -> parent  ("ready", [one_unit_per_group, ...])  or  ("init_error", message)
    parent -> child  ("score", prompt, completions, metadata, first_unit)
    child -> parent  ("unit", index, [outcome, ...])  for each unit from first_unit on

The child imports the reward functions once, then serves groups until the socket closes.
"""

import asyncio
import sys

from rewards.child_setup import connect
from rewards.scoring import Group, load_components, plan_units, run_unit


def _load(functions: list, timeout_s: float) -> tuple[tuple[list, float], list[bool]]:
    components = load_components(functions)
    return (components, timeout_s), [component.one_unit_per_group for component in components]


def main(fd: int) -> None:
    started = connect(fd, "reward", _load)
    if started is None:
        return
    connection, (components, timeout_s) = started
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
