"""SIGINT and SIGTERM during training: the first finishes the round, saves a checkpoint and stops;
a second stops at once without saving."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading

log = logging.getLogger(__name__)


@contextlib.contextmanager
def graceful_stop(trainer):
    """Inside the block, a signal calls ``trainer.request_stop(name)``; a second one raises
    KeyboardInterrupt. Outside the main thread, signals cannot be caught and nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if trainer.stop_requested:
            raise KeyboardInterrupt(f"second {name}: stopped without saving this round")
        trainer.request_stop(name)
        log.warning("%s: finishing this round, then saving a checkpoint and stopping (send it again to stop at "
                    "once, without saving)", name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
