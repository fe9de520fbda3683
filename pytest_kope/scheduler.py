"""Operators optimized at once (`--kope-concurrency N`): one thread per operator in flight.

Each operator keeps its own budget, stop rule, agent and judge; they share the controller's graph
(`OneAtATime`: the one writer, now from several threads), its git publisher (commits take
turns), its terminal and its clock. Judging is where the time goes, and it happens in child processes
(here or on Ray workers), so threads in the controller are enough: the controller only waits, reads
verdicts and writes the graph. With N = 1 the operators run one after the other in the calling
thread, exactly as before.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

T = TypeVar("T")


class Turns:
    """How many items have not started yet, counted as each one starts (for a fair time slot)."""

    def __init__(self, total: int):
        self._left = total
        self._lock = threading.Lock()

    def take(self) -> int:
        """The items left, this one included, at the moment it starts."""
        with self._lock:
            left = self._left
            self._left -= 1
            return left


def each(items: Sequence[T], work: Callable[[T, int], None], concurrency: int) -> None:
    """`work(item, left)` for every item, up to `concurrency` at once, in order of starting; `left` is
    the number of items not yet started, this one included. The first exception is raised once the
    items in flight have finished (none is started after it).

    The threads are daemons and the caller waits in short joins, so a signal's handler runs at once.
    Interrupted (session/interrupt.py), every judging child is killed and each thread in flight ends
    with `Interrupted`, raised here once they have; none starts after it. Whatever a thread had in
    flight leaves the graph whole: every graph write is one transaction.
    """
    turns = Turns(len(items))
    if concurrency <= 1 or len(items) <= 1:
        for item in items:
            work(item, turns.take())
        return
    pending: queue.SimpleQueue[T] = queue.SimpleQueue()
    for item in items:
        pending.put(item)
    errors: list[BaseException] = []

    def worker() -> None:
        while not errors:
            try:
                item = pending.get_nowait()
            except queue.Empty:
                return
            try:
                work(item, turns.take())
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread below
                errors.append(e)
                return

    threads = [
        threading.Thread(target=worker, name=f"kope-operator-{i}", daemon=True)
        for i in range(min(concurrency, len(items)))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.2)
    if errors:
        raise errors[0]


class OneAtATime:
    """`target` whose methods run one at a time, whichever thread calls them: the controller's graph
    (each method is one read or one write transaction on one SQLite connection, opened for use from
    any thread) and its git publisher (commits and pushes take turns). A recall in one operator's
    thread sees every attempt another thread has recorded: they share the connection.

    Attributes that are not methods are handed out as they are (`graph.db`: used directly only
    inside graph methods, or after the operators' threads have ended).
    """

    def __init__(self, target: object):
        self._target = target
        self._lock = threading.RLock()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return value(*args, **kwargs)

        return call


def one_at_a_time(target: T) -> T:
    """`target` behind a `OneAtATime`, typed as what it stands in for (it answers the same calls)."""
    return cast(T, OneAtATime(target))
