"""The isolated child process of an environment host (``python -m rewards.environment_child FD``).

Protocol over the socket ``FD`` (``multiprocessing.connection`` framing, pickled tuples):

    parent -> child  ("init", sys_path, imports, ref, kwargs)
    child -> parent  ("ready", None)  or  ("init_error", message)
    parent -> child  ("reset", key, row)   -> ("ok", None)  or ("error", reason)
    parent -> child  ("step", key, reply)  -> ("ok", Step)  or ("error", reason)
    parent -> child  ("close", key)        (no answer)

Each episode is one Environment instance under its key, until a step says done, the parent closes it,
or it is the oldest of more than MAX_EPISODES (a trajectory whose actor went away never closes its own).
"""

import collections
import sys

from rewards.child_setup import connect
from rewards.environments import Environment, InvalidStep, check_step, resolve_environment

MAX_EPISODES = 65536


def _load(ref: str, kwargs: dict) -> tuple[tuple[type, dict], None]:
    return (resolve_environment(ref), kwargs), None


def main(fd: int) -> None:
    started = connect(fd, "environment", _load)
    if started is None:
        return
    connection, (cls, kwargs) = started
    episodes: collections.OrderedDict[str, Environment] = collections.OrderedDict()
    while True:
        try:
            command, key, *argument = connection.recv()
        except EOFError:
            return
        if command == "close":
            episodes.pop(key, None)
            continue
        try:
            if command == "reset":
                episodes[key] = cls(**kwargs)
                while len(episodes) > MAX_EPISODES:
                    episodes.popitem(last=False)
                episodes[key].reset(*argument)
                answer = None
            elif key not in episodes:
                connection.send(("error", "lost"))  # evicted, or reset in a child that has since died
                continue
            else:
                answer = check_step(episodes[key].step(*argument))
                if answer.done:
                    del episodes[key]
        except InvalidStep as error:
            episodes.pop(key, None)
            connection.send(("error", str(error)))
            continue
        except Exception as error:  # noqa: BLE001 - any failure of user code ends its episode, not the child
            episodes.pop(key, None)
            connection.send(("error", f"raised:{type(error).__name__}"))
            continue
        connection.send(("ok", answer))


if __name__ == "__main__":
    main(int(sys.argv[1]))
