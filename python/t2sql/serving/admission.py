"""How many new calls enter the Grader per event-loop iteration (a burst must not stall the loop)."""

from __future__ import annotations

import asyncio
from collections import deque

# New calls that may start their loop-side work in one iteration of the event loop. Each call's
# set-up costs the loop some time, so a burst of hundreds of calls (a rollout's trajectories all
# starting at once) is spread over several short iterations instead of one long stall (the stall
# measurements: `t2sql bench serving`, docs/benchmarks.md).
CALLS_PER_ITERATION = 16


class Admission:
    """Lets at most `per_iteration` new calls into the Grader per event-loop iteration; the
    others wait in arrival order and are let in over the following iterations.

    asyncio runs every ready callback of an iteration before it looks at timers or I/O again,
    so without this a burst of N calls costs the loop N times one call's set-up in one go.
    The budget is renewed by a callback at the start of the next iteration; it is scheduled
    only once half the budget is spent, so sparse calls (one per iteration, the quiet case)
    do not pay an extra loop iteration each."""

    def __init__(self, per_iteration: int):
        self._per_iteration = per_iteration
        self._renew_at = max(1, per_iteration // 2)
        self._used = 0
        self._waiting: deque[asyncio.Future] = deque()
        self._renewal_scheduled = False

    def enter(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future | None:
        """None: go ahead. Else a future to await: it is done when this call's turn comes (a
        cancelled one is skipped by _renew). A plain function, not a coroutine: in a burst,
        most calls come here only to wait, and that must cost the loop as little as possible."""
        if self._used < self._per_iteration and not self._waiting:
            self._used += 1
            if self._used >= self._renew_at:
                self._schedule_renewal(loop)
            return None
        ticket = loop.create_future()
        self._waiting.append(ticket)
        self._schedule_renewal(loop)
        return ticket

    def _schedule_renewal(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._renewal_scheduled:
            self._renewal_scheduled = True
            loop.call_soon(self._renew, loop)

    def _renew(self, loop: asyncio.AbstractEventLoop) -> None:
        """A new iteration: a fresh budget, spent first on the calls that waited (they resume
        in the next iteration, in order)."""
        self._renewal_scheduled = False
        let_in = 0
        while self._waiting and let_in < self._per_iteration:
            fut = self._waiting.popleft()
            if not fut.done():
                fut.set_result(None)
                let_in += 1
        self._used = let_in
        if self._waiting or let_in >= self._renew_at:
            self._schedule_renewal(loop)
