"""SIGINT and SIGTERM during training: the first finishes the round, saves a checkpoint and stops;
a second stops at once without saving."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Callable

log = logging.getLogger(__name__)


@contextlib.contextmanager
def graceful_stop(request_stop: Callable[[str], bool]):
    """Inside the block, a signal calls ``request_stop(name)``, which says whether a stop had been
    requested already; then this one raises KeyboardInterrupt. Outside the main thread, signals
    cannot be caught and nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if request_stop(name):
            raise KeyboardInterrupt(f"second {name}: stopped without saving this round")
        log.warning("%s: finishing this round, then saving a checkpoint and stopping (send it again to stop at "
                    "once, without saving)", name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
