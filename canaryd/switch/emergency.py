"""The kill switch while the database cannot be used, and its adoption once it can.

`emergency_rollback` is the one exception to "database first": when the database is
unreachable, missing, corrupt, read-only or refuses the write, it writes a manual
rollback marked `pending_sync` to the state file by itself (same lock, same atomic
write, one generation above the file's) and runs the hooks, those it cannot build
included as failures. Until the database holds
it, no writer may replace that file with an older or different state; `adoptable_state`
and `pending_adoption` say what the switch service commits, under the row lock and before
anything else, as soon as it sees the file.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from canaryd.config import SwitchConfig
from canaryd.logs import get_logger
from canaryd.switch.actuators import Actuator, build_actuators, run_actuator, utcnow
from canaryd.switch.statefile import (
    PENDING_SYNC,
    STATE_FILE_ACTUATOR,
    file_lock,
    generation_of,
    is_pending,
    read_state_file,
    replace_file,
    state_object,
    without_pending,
)
from gates import Control, SwitchMode, SwitchState, Transition

if TYPE_CHECKING:
    from canaryd.metrics.switch import SwitchMetrics

__all__ = [
    "EMERGENCY_REASON_PREFIX",
    "SYNCED_NOTE",
    "EmergencyRollback",
    "adoptable_state",
    "emergency_rollback",
    "pending_adoption",
]

log = get_logger("canaryd.switch")

EMERGENCY_REASON_PREFIX = "EMERGENCY (database not updated): "
SYNCED_NOTE = "synced from state file after database outage"


@dataclass(frozen=True, slots=True)
class EmergencyRollback:
    """What `emergency_rollback` did: the object for the state file and the hooks, why
    the file could not be written (None: it was), and the hooks' failures by name."""

    state: dict[str, Any]
    file_error: str | None = None
    failures: dict[str, str] = field(default_factory=dict)

    @property
    def written(self) -> bool:
        return self.file_error is None


def _emergency_object(
    previous: dict[str, Any] | None, user: str, reason: str, now: datetime
) -> dict[str, Any]:
    latched = previous.get("latched") if previous else False
    state = SwitchState(
        mode=SwitchMode.ROLLED_BACK,
        control=Control.MANUAL,
        generation=max(generation_of(previous), 0) + 1,
        since=now,
        actor=f"user:{user}",
        reason=EMERGENCY_REASON_PREFIX + reason,
        latched=latched is True,  # a rollback keeps the latch, as the policy does
    )
    # The per-category switches stay as they are: the kill switch is the master's.
    categories = previous.get("categories") if previous else None
    obj = state_object(state)
    if isinstance(categories, dict):
        obj["categories"] = categories
    return {**obj, PENDING_SYNC: True}


def emergency_rollback(
    config: SwitchConfig,
    user: str,
    reason: str,
    *,
    now: datetime | None = None,
    metrics: SwitchMetrics | None = None,
    actuators: Sequence[Actuator] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> EmergencyRollback:
    """The kill switch while the database cannot be used: write a manual rollback marked
    `pending_sync` to the state file (same lock, same atomic write, one generation above
    the file's), then run the hooks. Production reads the file; the database adopts it
    when it is back (`SwitchService.adopt_pending`). Never raises for the file or a hook,
    nor for a hook that cannot be built: the result says what failed."""
    path = config.resolved_state_file()
    now = now or utcnow()
    obj = _emergency_object(read_state_file(path), user, reason, now)
    file_error: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(path):
            # Decided again under the lock: a concurrent writer may have moved the file.
            obj = _emergency_object(read_state_file(path), user, reason, now)
            replace_file(path, obj)
    except OSError as exc:
        file_error = f"cannot write {str(path)!r}: {exc}"
        if metrics is not None:
            metrics.actuator_failed(STATE_FILE_ACTUATOR)
        log.error("switch.state_file_failed", path=str(path), error=str(exc))
    log.warning(
        "switch.emergency_rollback",
        generation=obj["generation"],
        actor=obj["actor"],
        reason=obj["reason"],
        state_file=str(path),
        written=file_error is None,
    )
    failures: dict[str, str] = {}
    if actuators is None:
        actuators = build_actuators(config, utcnow)
    for actuator in actuators:
        error = run_actuator(actuator, obj, metrics=metrics, sleep=sleep)
        if error is not None:
            failures[actuator.name] = error
    return EmergencyRollback(obj, file_error, failures)


def adoptable_state(on_disk: dict[str, Any] | None, stored: SwitchState) -> SwitchState | None:
    """The state to adopt into the database from a `pending_sync` state file: the file's
    mode, control, actor, reason, time and latch at its generation, or one above the
    stored one when the database reached that generation, or passed it, with another
    state meanwhile (the file lagged: lost with /run at a reboot, a failed write). None
    when the file is not pending, is already held by the database (its state, whatever
    the generation), or cannot be read as a state. No clock is compared: a kill switch
    stamped by a clock that is behind is still a kill switch."""
    if on_disk is None or not is_pending(on_disk):
        return None
    generation = generation_of(on_disk)
    if generation == stored.generation and without_pending(on_disk) == state_object(stored):
        return None  # adopted; only the file's rewrite is missing
    try:
        raw_since = on_disk.get("since")
        since = datetime.fromisoformat(raw_since) if isinstance(raw_since, str) else None
        if since is not None and since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
    except ValueError as exc:
        log.error("switch.pending_file_unreadable", error=f"{type(exc).__name__}: {exc}")
        return None
    try:
        adopted = replace(
            stored,
            mode=SwitchMode(on_disk["mode"]),
            control=Control(on_disk["control"]),
            generation=max(generation, stored.generation + 1),
            since=since,
            actor=str(on_disk["actor"]),
            reason=str(on_disk["reason"]),
            latched=on_disk.get("latched", stored.latched) is True,
        )
    except (KeyError, TypeError, ValueError) as exc:
        log.error("switch.pending_file_unreadable", error=f"{type(exc).__name__}: {exc}")
        return None
    if generation <= stored.generation and state_object(
        replace(adopted, generation=stored.generation)
    ) == state_object(stored):
        return None  # adopted above its generation; only the file's rewrite is missing
    return adopted


def pending_adoption(
    state_file: Path, state: SwitchState, now: datetime
) -> tuple[SwitchState, Transition | None]:
    """`state`, or the pending state file's state and the transition adopting it."""
    adopted = adoptable_state(read_state_file(state_file), state)
    if adopted is None:
        return state, None
    since = adopted.since.isoformat() if adopted.since else "an unknown time"
    transition = Transition(
        at=now,
        generation=adopted.generation,
        previous=state.mode,
        target=adopted.mode,
        control=adopted.control,
        actor=adopted.actor,
        reason=f"{adopted.reason} ({SYNCED_NOTE}; written to the state file at {since})",
    )
    return adopted, transition
