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
import ctypes
import importlib
import logging
import signal
import sys
from multiprocessing.connection import Connection

from rewards.environments import Environment, InvalidStep, check_step, resolve_environment

_PR_SET_PDEATHSIG = 1
MAX_EPISODES = 65536


def main(fd: int) -> None:
    # Die with the reward worker even while stuck in user code (libc prctl; not in the stdlib).
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    logging.basicConfig(level=logging.WARNING, format="environment child: %(levelname)s %(name)s: %(message)s")
    connection = Connection(fd)
    _, sys_path, imports, ref, kwargs = connection.recv()
    sys.path[:0] = [entry for entry in sys_path if entry not in sys.path]
    try:
        for module in imports:
            importlib.import_module(module)
        cls = resolve_environment(ref)
    except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it
        connection.send(("init_error", f"{type(error).__name__}: {error}"))
        return
    connection.send(("ready", None))
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
