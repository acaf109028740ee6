"""What broken user code does, as source for the user modules that the reward pool and environment
tests write to a temporary dir (the code runs in an isolated child, which it may kill)."""

MISBEHAVE_ON = '''
import ctypes, os, time

def misbehave_on(word, error):
    """On "raise", "hang", "exit" or "segfault": raise `error`, sleep a minute, exit the process or
    crash it; on any other word, nothing."""
    if word == "raise":
        raise error("bad input")
    if word == "hang":
        time.sleep(60)
    if word == "exit":
        os._exit(3)
    if word == "segfault":
        ctypes.string_at(0)
'''
