"""The rollback switch's actuators and the service that changes and applies its state.

The database row is the truth; everything else mirrors it, in a fixed order: the policy's
outcome is committed under the row lock first, then the state file production reads is
rewritten atomically, then the optional hooks run (command, webhook, Alertmanager), each
retried with exponential back-off. A failed actuator is counted, logged and recorded on
the row (`canaryd switch status` shows it); it never changes or reverts the state, and
`SwitchService.ensure_applied()` (the daemon at start and on every gate run) re-applies a
generation whose last application failed. CLI and daemon both go through this service.

The one exception to "database first" is the kill switch while the database is down:
`emergency_rollback` writes a rolled-back state file by itself, marked `pending_sync`, and
runs the hooks. Until the database holds it, no writer may replace that file with an older
or different state; the service adopts it into the database as a transition (under the
row lock, before anything else) as soon as it sees it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import httpx
import structlog

from canaryd.config import AlertmanagerConfig, CommandHookConfig, SwitchConfig, WebhookConfig
from canaryd.errors import CanarydError
from canaryd.metrics import CanarydMetrics
from canaryd.store import SqlStore, SwitchRecord
from gates import (
    Control,
    Evaluation,
    SwitchEvent,
    SwitchMode,
    SwitchOutcome,
    SwitchPolicyConfig,
    SwitchState,
    Transition,
    step,
)

__all__ = [
    "ALERT_NAME",
    "EMERGENCY_REASON_PREFIX",
    "PENDING_SYNC",
    "STATE_FILE_ACTUATOR",
    "SYNCED_NOTE",
    "Actuator",
    "ActuatorError",
    "AlertmanagerActuator",
    "ApplyReport",
    "CommandActuator",
    "EmergencyRollback",
    "SwitchChange",
    "SwitchService",
    "WebhookActuator",
    "adoptable_state",
    "build_actuators",
    "emergency_rollback",
    "read_state_file",
    "sign",
    "state_object",
    "write_state_file",
]

log = structlog.get_logger(__name__)

ALERT_NAME = "CanarydSpeculativeRolledBack"
STATE_FILE_ACTUATOR = "state_file"
SIGNATURE_HEADER = "X-Canaryd-Signature"
_OUTPUT_TAIL = 300  # characters of a failed command's output kept in the error
PENDING_SYNC = "pending_sync"  # state-file field: written while the database was down
EMERGENCY_REASON_PREFIX = "EMERGENCY (database unreachable): "
SYNCED_NOTE = "synced from state file after database outage"


class ActuatorError(CanarydError, RuntimeError):
    """One actuator could not apply the switch state (after its retries)."""

    def __init__(self, actuator: str, reason: str) -> None:
        self.actuator, self.reason = actuator, reason
        super().__init__(f"switch actuator {actuator!r} failed: {reason}")


# --- the state object and its file ------------------------------------------------------


def state_object(state: SwitchState) -> dict[str, Any]:
    """What production reads (the state file, the webhook body, `switch status --json`)."""
    return {
        "mode": state.mode.value,
        "speculative_enabled": state.speculative_enabled,
        "reason": state.reason,
        "since": state.since.isoformat() if state.since else None,
        "actor": state.actor,
        "generation": state.generation,
        "control": state.control.value,
        "latched": state.latched,
    }


def read_state_file(path: Path) -> dict[str, Any] | None:
    """The state file's object; None when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _file_generation(path: Path) -> int:
    return _generation(read_state_file(path))


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    lock = path.with_name(f".{path.name}.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _generation(data: dict[str, Any] | None) -> int:
    value = data.get("generation") if data else None
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _is_pending(data: dict[str, Any] | None) -> bool:
    return data is not None and data.get(PENDING_SYNC) is True


def _without_pending(data: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in data.items() if key != PENDING_SYNC}


def _replace_file(path: Path, state: dict[str, Any]) -> None:
    """The atomic write itself; the caller holds the lock."""
    body = (json.dumps(state, indent=2, sort_keys=True) + "\n").encode()
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o644)  # readable by production's user
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        Path(temp).replace(path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_state_file(path: Path, state: dict[str, Any]) -> bool:
    """Atomically replace `path` with `state` as JSON: a temp file in the same directory,
    fsync, rename, fsync of the directory. Writers serialise on a lock file beside it and
    never replace a higher generation (a slow writer cannot move production backwards),
    nor a `pending_sync` emergency file with anything but a higher generation or the same
    state without the mark (its adoption); returns False when it skipped for that reason."""
    path.parent.mkdir(parents=True, exist_ok=True)
    generation = int(state["generation"])
    with _file_lock(path):
        on_disk = read_state_file(path)
        if _generation(on_disk) > generation:
            return False
        if (
            on_disk is not None
            and _is_pending(on_disk)
            and not _is_pending(state)
            and _generation(on_disk) == generation
            and _without_pending(on_disk) != state
        ):
            # A writer that decided before the emergency file appeared lands on the same
            # generation; the operator's rollback wins until the database adopts it.
            return False
        _replace_file(path, state)
    return True


# --- actuators ------------------------------------------------------------------------


class Actuator(Protocol):
    """Tells something outside about a switch state; raises `ActuatorError` on failure.
    `apply` is called once per attempt; `retries` and `backoff_s` drive the retries."""

    name: str
    retries: int
    backoff_s: float

    def apply(self, state: dict[str, Any]) -> None: ...

    def keepalive(self, state: dict[str, Any], now: datetime) -> bool:
        """True when the state should be re-sent although it has not changed."""
        ...


def sign(secret: bytes, body: bytes) -> str:
    """The `X-Canaryd-Signature` value: `sha256=` and the hex HMAC-SHA256 of `body`."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


class CommandActuator:
    """Runs `argv` (no shell) with the state in CANARYD_SWITCH_* environment variables
    (MODE, SPECULATIVE_ENABLED, REASON, SINCE, ACTOR, GENERATION, CONTROL, LATCHED, and
    JSON for the whole object); a non-zero exit or the timeout is a failure."""

    name = "command"

    def __init__(self, config: CommandHookConfig) -> None:
        self.config = config
        self.retries = config.retries
        self.backoff_s = config.backoff_s

    def apply(self, state: dict[str, Any]) -> None:
        env = dict(os.environ)
        for key, value in state.items():
            env[f"CANARYD_SWITCH_{key.upper()}"] = _env_value(value)
        env["CANARYD_SWITCH_JSON"] = json.dumps(state, sort_keys=True)
        try:
            completed = subprocess.run(
                self.config.argv,
                env=env,
                capture_output=True,
                text=True,
                timeout=self.config.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ActuatorError(
                self.name, f"{self.config.argv[0]!r} timed out after {self.config.timeout_s:g}s"
            ) from None
        except OSError as exc:
            raise ActuatorError(self.name, f"cannot run {self.config.argv[0]!r}: {exc}") from exc
        if completed.returncode != 0:
            output = (completed.stderr or completed.stdout).strip()[-_OUTPUT_TAIL:]
            raise ActuatorError(
                self.name,
                f"{self.config.argv[0]!r} exited with {completed.returncode}: {output!r}",
            )

    def keepalive(self, state: dict[str, Any], now: datetime) -> bool:
        return False


def _post(name: str, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> None:
    try:
        response = httpx.post(url, content=body, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ActuatorError(name, f"POST {url}: {type(exc).__name__}: {exc}") from exc
    if response.status_code >= 300:
        raise ActuatorError(
            name, f"POST {url} answered {response.status_code}: {response.text[:200]!r}"
        )


class WebhookActuator:
    """POSTs the state object as JSON; with a secret, signs the exact body bytes."""

    name = "webhook"

    def __init__(self, config: WebhookConfig) -> None:
        self.config = config
        self.retries = config.retries
        self.backoff_s = config.backoff_s
        self._secret = self._read_secret()

    def _read_secret(self) -> bytes | None:
        cfg = self.config
        if cfg.secret is not None:
            return cfg.secret.get_secret_value().encode()
        if cfg.secret_env:
            value = os.environ.get(cfg.secret_env)
            if not value:
                raise ActuatorError(self.name, f"secret_env {cfg.secret_env!r} is not set")
            return value.strip().encode()
        if cfg.secret_file is not None:
            try:
                return cfg.secret_file.read_text(encoding="utf-8").strip().encode()
            except OSError as exc:
                raise ActuatorError(
                    self.name, f"cannot read secret_file {str(cfg.secret_file)!r}: {exc}"
                ) from exc
        return None

    def apply(self, state: dict[str, Any]) -> None:
        body = json.dumps(state, sort_keys=True).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Canaryd-Generation": str(state["generation"]),
        }
        if self._secret is not None:
            headers[SIGNATURE_HEADER] = sign(self._secret, body)
        _post(self.name, self.config.url, body, headers, self.config.timeout_s)

    def keepalive(self, state: dict[str, Any], now: datetime) -> bool:
        return False


class AlertmanagerActuator:
    """Pushes `CanarydSpeculativeRolledBack` to Alertmanager's `/api/v2/alerts`: firing
    while rolled back (re-pushed every `resend_s`, since Alertmanager resolves an alert
    that is not re-sent), resolved (`endsAt` now) when speculative decoding is back on."""

    name = "alertmanager"

    def __init__(self, config: AlertmanagerConfig, clock: Callable[[], datetime]) -> None:
        self.config = config
        self.retries = config.retries
        self.backoff_s = config.backoff_s
        self._clock = clock
        self._last_push: datetime | None = None

    def alert(self, state: dict[str, Any], now: datetime) -> dict[str, Any]:
        firing = not state["speculative_enabled"]
        alert: dict[str, Any] = {
            "labels": {
                **self.config.labels,
                "alertname": ALERT_NAME,
                "service": "canaryd",
                "severity": "critical" if state.get("latched") else "warning",
            },
            "annotations": {
                "summary": "speculative decoding rolled back by canaryd"
                if firing
                else "speculative decoding restored",
                "description": state["reason"],
                "actor": state["actor"],
                "generation": str(state["generation"]),
            },
            "startsAt": state["since"] or now.isoformat(),
        }
        if not firing:
            alert["endsAt"] = now.isoformat()
        return alert

    def apply(self, state: dict[str, Any]) -> None:
        now = self._clock()
        body = json.dumps([self.alert(state, now)]).encode()
        url = f"{self.config.url}/api/v2/alerts"
        _post(self.name, url, body, {"Content-Type": "application/json"}, self.config.timeout_s)
        self._last_push = now

    def keepalive(self, state: dict[str, Any], now: datetime) -> bool:
        if state["speculative_enabled"]:
            return False
        last = self._last_push
        return last is None or now - last >= timedelta(seconds=self.config.resend_s)


def _actuator_factories(
    config: SwitchConfig, clock: Callable[[], datetime]
) -> list[Callable[[], Actuator]]:
    factories: list[Callable[[], Actuator]] = []
    if (command := config.command) is not None:
        factories.append(lambda: CommandActuator(command))
    if (webhook := config.webhook) is not None:
        factories.append(lambda: WebhookActuator(webhook))
    if (alertmanager := config.alertmanager) is not None:
        factories.append(lambda: AlertmanagerActuator(alertmanager, clock))
    return factories


def build_actuators(
    config: SwitchConfig, clock: Callable[[], datetime] | None = None
) -> list[Actuator]:
    """The configured hooks, in the order they run: command, webhook, Alertmanager."""
    return [make() for make in _actuator_factories(config, clock or _utcnow)]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _run_actuator(
    actuator: Actuator,
    state: dict[str, Any],
    *,
    metrics: CanarydMetrics | None,
    sleep: Callable[[float], None],
) -> str | None:
    """Apply `state` through one actuator with its retries; the last error, or None."""
    delay = actuator.backoff_s
    error = ""
    for attempt in range(actuator.retries + 1):
        if attempt:
            sleep(delay)
            delay *= 2
        try:
            actuator.apply(state)
        except ActuatorError as exc:
            error = exc.reason
        except Exception as exc:  # a hook bug must not stop the others
            error = f"{type(exc).__name__}: {exc}"
        else:
            return None
        if metrics is not None:
            metrics.actuator_failed(actuator.name)
        log.error(
            "switch.actuator_failed",
            actuator=actuator.name,
            attempt=attempt + 1,
            of=actuator.retries + 1,
            generation=state["generation"],
            error=error,
        )
    return error


# --- the kill switch without the database ---------------------------------------------


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
        generation=max(_generation(previous), 0) + 1,
        since=now,
        actor=f"user:{user}",
        reason=EMERGENCY_REASON_PREFIX + reason,
        latched=latched is True,  # a rollback keeps the latch, as the policy does
    )
    return {**state_object(state), PENDING_SYNC: True}


def emergency_rollback(
    config: SwitchConfig,
    user: str,
    reason: str,
    *,
    now: datetime | None = None,
    metrics: CanarydMetrics | None = None,
    actuators: Sequence[Actuator] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> EmergencyRollback:
    """The kill switch while the database is unreachable: write a manual rollback marked
    `pending_sync` to the state file (same lock, same atomic write, one generation above
    the file's), then run the hooks. Production reads the file; the database adopts it
    when it is back (`SwitchService.adopt_pending`). Never raises for the file or a hook:
    the result says what failed."""
    path = config.resolved_state_file()
    now = now or _utcnow()
    obj = _emergency_object(read_state_file(path), user, reason, now)
    file_error: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _file_lock(path):
            # Decided again under the lock: a concurrent writer may have moved the file.
            obj = _emergency_object(read_state_file(path), user, reason, now)
            _replace_file(path, obj)
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
        built: list[Actuator] = []
        for make in _actuator_factories(config, _utcnow):
            try:
                built.append(make())
            except ActuatorError as exc:  # one hook's bad secret must not stop the others
                failures[exc.actuator] = exc.reason
        actuators = built
    for actuator in actuators:
        error = _run_actuator(actuator, obj, metrics=metrics, sleep=sleep)
        if error is not None:
            failures[actuator.name] = error
    return EmergencyRollback(obj, file_error, failures)


def adoptable_state(on_disk: dict[str, Any] | None, stored: SwitchState) -> SwitchState | None:
    """The state to adopt into the database from a `pending_sync` state file: the file's
    mode, control, actor, reason, time and latch at its generation, or one above the
    stored one when the database reached that generation with another state meanwhile.
    None when the file is not pending, is older than the database (a generation below
    it and written before its last transition), is already adopted,
    or cannot be read as a state."""
    if on_disk is None or not _is_pending(on_disk):
        return None
    generation = _generation(on_disk)
    if generation == stored.generation and _without_pending(on_disk) == state_object(stored):
        return None  # adopted; only the file's rewrite is missing
    try:
        raw_since = on_disk.get("since")
        since = datetime.fromisoformat(raw_since) if isinstance(raw_since, str) else None
        if since is not None and since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
    except ValueError as exc:
        log.error("switch.pending_file_unreadable", error=f"{type(exc).__name__}: {exc}")
        return None
    if generation < stored.generation and (
        since is None or stored.since is None or since <= stored.since
    ):
        # The database moved on after adopting it; the file is stale. A pending file that
        # is below the database yet written after its last transition is a new kill switch
        # on a file that lagged (lost with /run at a reboot, a failed write): adopted.
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
    return adopted


# --- the service ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ApplyReport:
    """How applying one generation went: failures by actuator name (empty: all applied)."""

    generation: int
    failures: dict[str, str] = field(default_factory=dict)
    file_skipped: bool = False  # a newer generation was already in the state file

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass(frozen=True, slots=True)
class SwitchChange:
    """A command's or a gate run's result: the policy outcome and, when it changed the
    state (or the state was not yet applied), how applying it went."""

    outcome: SwitchOutcome
    report: ApplyReport | None
    adopted: Transition | None = None  # a pending emergency rollback it synced first

    @property
    def state(self) -> SwitchState:
        return self.outcome.state


def _actor_kind(actor: str) -> str:
    return "user" if actor.startswith("user:") else "gate"


class SwitchService:
    """Changes the switch through the policy, under the database row lock, and applies
    the result: state file, then hooks. Used by the daemon's gate hook and by the CLI."""

    def __init__(
        self,
        store: SqlStore,
        config: SwitchConfig,
        policy: SwitchPolicyConfig,
        *,
        metrics: CanarydMetrics | None = None,
        actuators: Sequence[Actuator] | None = None,
        clock: Callable[[], datetime] = _utcnow,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self.config = config
        self.policy = policy
        self.metrics = metrics
        self.clock = clock
        self.sleep = sleep
        self.state_file = config.resolved_state_file()
        self.actuators = (
            list(actuators) if actuators is not None else build_actuators(config, clock)
        )

    def _history(self) -> int:
        # The policy reads at most the last trip_m (trip) or restore_passes (auto-restore)
        # evaluations since the last transition; a few more cost nothing.
        return max(self.policy.trip_m, self.policy.restore_passes) + 5

    def record(self) -> SwitchRecord:
        return self.store.switch()

    def _adopt(self, state: SwitchState, now: datetime) -> tuple[SwitchState, Transition | None]:
        """`state`, or the pending state file's state and the transition adopting it."""
        adopted = adoptable_state(read_state_file(self.state_file), state)
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

    def _change(
        self, events: Sequence[SwitchEvent], now: datetime, actor: str = ""
    ) -> SwitchChange:
        adoption: Transition | None = None

        def decide(state: SwitchState, history: list[Evaluation]) -> SwitchOutcome:
            nonlocal adoption
            # Under the row lock: an emergency rollback written while the database was
            # down is adopted first, so neither a command nor the gates can revert it.
            start, adoption = self._adopt(state, now)
            # A state file from an earlier database may carry a higher generation:
            # continue above it so the file never goes back.
            floor = _file_generation(self.state_file)
            if adoption is None and floor > start.generation:
                start = replace(start, generation=floor)
            outcome = step(start, history, self.policy, now=now, events=events)
            transitions = (
                outcome.transitions if adoption is None else (adoption, *outcome.transitions)
            )
            if not transitions:
                return SwitchOutcome(state, (), outcome.refused)
            return SwitchOutcome(outcome.state, transitions, outcome.refused)

        outcome = self.store.change_switch(decide, now=now, history=self._history(), actor=actor)
        self._log(outcome, adoption)
        report = self.apply(outcome.state) if outcome.transitions else self.ensure_applied()
        self.export_metrics(outcome.state)
        return SwitchChange(outcome, report, adoption)

    def adopt_pending(self) -> SwitchChange | None:
        """Adopt a `pending_sync` state file (an emergency rollback written while the
        database was down) into the database as a transition at its generation, then
        apply it (the file is rewritten without the mark); None when there is none."""
        if not _is_pending(read_state_file(self.state_file)):
            return None  # the common case costs one file read, no database lock
        now = self.clock()
        adoption: Transition | None = None

        def decide(state: SwitchState, history: list[Evaluation]) -> SwitchOutcome:
            nonlocal adoption
            adopted, adoption = self._adopt(state, now)
            return SwitchOutcome(adopted, () if adoption is None else (adoption,))

        outcome = self.store.change_switch(decide, now=now, history=0)
        if adoption is None:
            return None
        self._log(outcome, adoption)
        report = self.apply(outcome.state)
        self.export_metrics(outcome.state)
        return SwitchChange(outcome, report, adoption)

    def _log(self, outcome: SwitchOutcome, adoption: Transition | None) -> None:
        if adoption is not None:
            log.warning(
                "switch.adopted_state_file",
                generation=adoption.generation,
                actor=adoption.actor,
                path=str(self.state_file),
            )
        for transition in outcome.transitions:
            log.warning(
                "switch.transition",
                generation=transition.generation,
                previous=transition.previous.value,
                target=transition.target.value,
                control=transition.control.value,
                actor=transition.actor,
                reason=transition.reason,
            )
            if self.metrics is not None:
                self.metrics.switch_transition(
                    transition.target.value, _actor_kind(transition.actor)
                )
        for refusal in outcome.refused:
            log.warning("switch.refused", reason=refusal)

    def command(self, event: SwitchEvent) -> SwitchChange:
        """A human's rollback, restore or auto, as the policy allows it, then applied."""
        return self._change([event], self.clock(), actor=f"user:{event.user}")

    def step_gates(self, now: datetime) -> SwitchChange:
        """Let the policy act on the stored evaluations at `now`, then apply."""
        return self._change([], now)

    def export_metrics(self, state: SwitchState) -> None:
        if self.metrics is not None:
            self.metrics.set_switch(
                rolled_back=state.mode is SwitchMode.ROLLED_BACK,
                generation=state.generation,
                latched=state.latched,
            )

    def _attempt(self, actuator: Actuator, state: dict[str, Any]) -> str | None:
        return _run_actuator(actuator, state, metrics=self.metrics, sleep=self.sleep)

    def apply(self, state: SwitchState, *, hooks: bool = True) -> ApplyReport:
        """Mirror `state` to the state file, then run the hooks; record the result on the
        switch row. Failures are returned and recorded, never raised."""
        obj = state_object(state)
        failures: dict[str, str] = {}
        skipped = False
        try:
            skipped = not write_state_file(self.state_file, obj)
        except OSError as exc:
            failures[STATE_FILE_ACTUATOR] = f"cannot write {str(self.state_file)!r}: {exc}"
            if self.metrics is not None:
                self.metrics.actuator_failed(STATE_FILE_ACTUATOR)
            log.error("switch.state_file_failed", path=str(self.state_file), error=str(exc))
        if hooks:
            for actuator in self.actuators:
                error = self._attempt(actuator, obj)
                if error is not None:
                    failures[actuator.name] = error
        self.store.record_actuation(state.generation, failures, self.clock())
        return ApplyReport(state.generation, failures, skipped)

    def ensure_applied(self) -> ApplyReport | None:
        """Re-apply the stored state when its last application failed or the state file
        does not show it (a restart, a CLI whose hook failed, a file deleted by hand);
        None when nothing was needed. Alertmanager is re-pushed while rolled back. A
        pending emergency rollback in the state file is adopted first, never overwritten."""
        adopted = self.adopt_pending()
        if adopted is not None:
            return adopted.report
        record = self.store.switch()
        state = record.state
        on_disk = read_state_file(self.state_file)
        if not record.applied or on_disk != state_object(state):
            return self.apply(state, hooks=not record.applied)
        now = self.clock()
        obj = state_object(state)
        failures: dict[str, str] = {}
        for actuator in self.actuators:
            if actuator.keepalive(obj, now):
                error = self._attempt(actuator, obj)
                if error is not None:
                    failures[actuator.name] = error
        if failures:
            self.store.record_actuation(state.generation, failures, now)
            return ApplyReport(state.generation, failures)
        return None

    def file_matches(self, record: SwitchRecord) -> bool:
        return read_state_file(self.state_file) == state_object(record.state)
