"""SIGTERM unwinds a t2sql command the way SIGINT (Ctrl-C) does: inside `sigterm_unwinds()` it raises a
KeyboardInterrupt where the process is, so every `finally` that cleans up after Ctrl-C (a temporary output,
t2sql.atomic) cleans up after `kill`, `timeout` or a job scheduler too; left to its default SIGTERM runs none.
The exit statuses: docs/cli.md, "Exit status"."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import warnings
from typing import Iterator

EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_TERMINATED = 128 + signal.SIGTERM


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process was, as SIGINT raises KeyboardInterrupt. An interrupt, not an error
    (so no T2sqlError: `except Exception` must not stop it); code catches KeyboardInterrupt, and
    interrupt_exit / interrupt_word tell the two apart."""


def interrupt_exit(interrupt: KeyboardInterrupt) -> int:
    """The exit status of a command that ended on `interrupt`."""
    return EXIT_TERMINATED if isinstance(interrupt, _Terminated) else EXIT_INTERRUPTED


def interrupt_word(interrupt: KeyboardInterrupt) -> str:
    """How a message names it: "terminated" (SIGTERM) or "interrupted" (SIGINT)."""
    return "terminated" if isinstance(interrupt, _Terminated) else "interrupted"


def quiet_teardown() -> None:
    """Called once an interrupt has been reported: what it left half-made (an event loop it stopped while
    starting, a coroutine cancelled before its first step) is collected at exit with a complaint and a
    traceback that tell the user nothing they can act on; those complaints are dropped. Outputs are
    already answered for (t2sql.atomic)."""
    sys.unraisablehook = lambda unraisable: None
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While inside, SIGTERM raises that KeyboardInterrupt in this process's main thread (with an asyncio loop running
    there, from a callback of the loop's, so that asyncio.run cancels and unwinds every task); the handler
    that was there before comes back on the way out. A process forked meanwhile that gets SIGTERM ends at once, as it
    would have (the unwinding is the command's, not a child's). Off the main thread (where Python takes
    no signal handler) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()
    scheduled = False

    def terminate(signum: int, frame: object) -> None:
        nonlocal scheduled
        if os.getpid() != owner:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        loop = _running_loop()
        if loop is not None and not scheduled:
            # Raised here, inside asyncio, it would land in whichever task runs now and stay stored in it
            # (asyncio prints it at exit as "never retrieved"); raised by a callback of the loop's own, it
            # stops the loop, and asyncio.run cancels and unwinds every task, as it does for Ctrl-C. A
            # second SIGTERM, with the loop stuck, raises at once.
            scheduled = True
            loop.call_soon_threadsafe(_raise_terminated)
            return
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_terminated() -> None:
    raise _Terminated()


def _running_loop():
    """The asyncio loop running in this thread, if any (asyncio itself is not imported for the question)."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return None
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
