"""`kill -USR1 <stub pid>` writes every Python thread's stack of that stub to the server log.

A stub whose main thread is stuck shows only as "Stub process ... is not healthy" on every
request; its stacks say where it waits. faulthandler writes from the signal handler itself, so
this works while the GIL is held by a stuck thread.
"""
from __future__ import annotations

import faulthandler
import signal
import sys


def enable_stack_dump() -> None:
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)
