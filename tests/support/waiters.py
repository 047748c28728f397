"""Threads that wait for a lease one after another, to see the order they are admitted in."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import quotaengine as q


def start_in_turn(n: int, waiter: Callable[[int], None]) -> list[threading.Thread]:
    """Starts `n` threads running ``waiter(i)``, each 0.1 s after the one before (so each
    starts waiting after the one before it)."""
    threads = []
    for i in range(n):
        th = threading.Thread(target=waiter, args=(i,))
        th.start()
        threads.append(th)
        time.sleep(0.1)
    return threads


def order_of_admission(lease: Callable[[int], q.Lease], held: q.Lease, n: int) -> list[int]:
    """Starts `n` threads, each 0.1 s after the one before, the i-th waiting on ``lease(i)``,
    then releases `held`: the order in which they were admitted (each holds its lease 50 ms)."""
    order: list[int] = []
    lock = threading.Lock()

    def waiter(i: int) -> None:
        got = lease(i)
        with lock:
            order.append(i)
        time.sleep(0.05)
        got.release()

    threads = start_in_turn(n, waiter)
    held.release()
    for th in threads:
        th.join()
    return order


def admitted_one_at_a_time(lease: Callable[[int], q.Lease], n: int, free_one: Callable[[], None]) -> list[int]:
    """Starts `n` threads, each 0.1 s after the one before, the i-th waiting on ``lease(i)``
    (each ends its lease with ``success()`` at once, so that what it took stays taken), then
    frees room for one admission at a time with ``free_one()``, each once the one before
    was admitted and recorded (at most 10 s later): the order in which they were admitted."""
    order: list[int] = []
    done = threading.Condition()

    def waiter(i: int) -> None:
        lease(i).success()
        with done:
            order.append(i)
            done.notify_all()

    threads = start_in_turn(n, waiter)
    time.sleep(0.1)  # the last has been refused once: it waits
    for k in range(n):
        free_one()
        with done:
            done.wait_for(lambda k=k: len(order) > k, timeout=10)
    for th in threads:
        th.join()
    return order


def admitted_while_it_waits(waiting: Any, free: Callable[[], q.Lease]) -> bool:
    """Steps ``waiting`` (the stepper of ``engine._lease_waiter`` / ``_lease_any_waiter``)
    once, refused, so that it waits in its engine's queue; then calls ``free`` in another
    thread: whether ``free`` was admitted while ``waiting`` still waited (within 5 s; then
    ``waiting`` leaves the queue and ``free`` goes on)."""
    lease, _ = waiting.step()
    assert lease is None, "the first must wait"
    admitted = threading.Event()

    def run() -> None:
        free().success()
        admitted.set()

    th = threading.Thread(target=run)
    th.start()
    admitted.wait(5)
    before = admitted.is_set()
    waiting.close()
    th.join()
    return before
