"""Threads that wait for a lease one after another, to see the order they are admitted in."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import quotaengine as q


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

    threads = []
    for i in range(n):
        th = threading.Thread(target=waiter, args=(i,))
        th.start()
        threads.append(th)
        time.sleep(0.1)  # each starts waiting after the one before
    held.release()
    for th in threads:
        th.join()
    return order
