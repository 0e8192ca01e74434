"""Delivering switch states to the hooks in generation order.

Two writers (the daemon's gate run and an operator's command, or two threads) each
commit a generation and then run the hooks; left alone, a slow hook carrying an older
generation lands after a newer one, and nothing sends the newer one again. So each
hook's deliveries are serialised on a ledger file beside the state file
(`.switch.json.hook-<name>`), which also holds the last generation that hook delivered.
Under it, `deliver` sends the newest state known (the one asked for, or a newer one
read again just before sending), never one below the ledger, and after a send reads the
newest again and sends that too if it moved meanwhile. A ledger that cannot be opened
or locked in time never stops a hook: it is then sent without the ordering.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from canaryd.logs import get_logger
from canaryd.switch.actuators import Actuator, run_actuator
from canaryd.switch.statefile import flock_within, generation_of, open_lock_file

if TYPE_CHECKING:
    from canaryd.metrics.switch import SwitchMetrics

__all__ = ["LEDGER_WAIT_S", "deliver", "ledger_path", "newest"]

log = get_logger("canaryd.switch")

# How long a delivery waits for another one to the same hook; above the slowest default
# hook with its retries (four 10 s attempts and their back-off), and still bounded so a
# wedged process holding the ledger cannot hold the kill switch's hooks back for ever.
LEDGER_WAIT_S = 120.0
_MAX_ROUNDS = 8  # sends in one delivery; each needs a newer generation than the last


def ledger_path(state_file: Path, name: str) -> Path:
    return state_file.with_name(f".{state_file.name}.hook-{name}")


def newest(*candidates: dict[str, Any] | None) -> dict[str, Any] | None:
    """The candidate with the highest generation; the earliest one on a tie."""
    best: dict[str, Any] | None = None
    for candidate in candidates:
        if candidate is not None and (
            best is None or generation_of(candidate) > generation_of(best)
        ):
            best = candidate
    return best


class _Ledger:
    """An open, locked ledger: the last generation delivered, read and written in place
    (not written when this user may only read it: the lock still orders deliveries)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def sent(self) -> int:
        os.lseek(self._fd, 0, os.SEEK_SET)
        text = os.read(self._fd, 64).decode("ascii", "replace").strip()
        return int(text) if text.lstrip("-").isdigit() else -1

    def record(self, generation: int) -> None:
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"{generation}\n".encode(), 0)
        except OSError as exc:
            log.info("switch.hook_ledger_read_only", error=str(exc))


@contextlib.contextmanager
def _locked(path: Path, wait_s: float) -> Iterator[_Ledger | None]:
    """The ledger at `path` under its exclusive lock; None (and a log line) when it cannot
    be opened or is still held by another delivery after `wait_s`."""
    try:
        fd = open_lock_file(path)
    except OSError as exc:
        log.warning("switch.hook_ledger_unavailable", path=str(path), error=str(exc))
        yield None
        return
    try:
        if not flock_within(fd, wait_s):
            log.warning("switch.hook_ledger_busy", path=str(path), waited_s=wait_s)
            yield None
            return
        yield _Ledger(fd)
    finally:
        os.close(fd)  # closing releases the lock


def deliver(
    actuator: Actuator,
    state: dict[str, Any],
    *,
    state_file: Path,
    latest: Callable[[], dict[str, Any] | None],
    metrics: SwitchMetrics | None,
    sleep: Callable[[float], None],
    again: bool = False,
    wait_s: float = LEDGER_WAIT_S,
) -> str | None:
    """Send `state`, or the newer state `latest()` returns, through `actuator` in order:
    nothing below the last generation this hook delivered, and the same generation only
    when `again` (a keep-alive). Returns the last error, or None (sent, or nothing newer
    to send)."""
    with _locked(ledger_path(state_file, actuator.name), wait_s) as ledger:
        if ledger is None:
            return run_actuator(actuator, state, metrics=metrics, sleep=sleep)
        sent = ledger.sent()
        target = newest(latest(), state) or state
        generation = generation_of(target)
        if generation < sent or (generation == sent and not again):
            log.info(
                "switch.hook_up_to_date",
                actuator=actuator.name,
                generation=generation_of(state),
                delivered=sent,
            )
            return None
        for _ in range(_MAX_ROUNDS):
            error = run_actuator(actuator, target, metrics=metrics, sleep=sleep)
            if error is not None:
                return error
            ledger.record(generation)
            # A writer that committed while this one was sending is waiting on the ledger
            # or has given up on it: send its newer state now, in order.
            following = newest(latest(), target) or target
            if generation_of(following) <= generation:
                return None
            target, generation = following, generation_of(following)
    return None
