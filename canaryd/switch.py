"""The rollback switch's actuators and the service that changes and applies its state.

The database row is the truth; everything else mirrors it, in a fixed order: the policy's
outcome is committed under the row lock first, then the state file production reads is
rewritten atomically, then the optional hooks run (command, webhook, Alertmanager), each
retried with exponential back-off. A failed actuator is counted, logged and recorded on
the row (`canaryd switch status` shows it); it never changes or reverts the state, and
`SwitchService.ensure_applied()` (the daemon at start and on every gate run) re-applies a
generation whose last application failed. CLI and daemon both go through this service.
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
    Evaluation,
    SwitchEvent,
    SwitchMode,
    SwitchOutcome,
    SwitchPolicyConfig,
    SwitchState,
    step,
)

__all__ = [
    "ALERT_NAME",
    "STATE_FILE_ACTUATOR",
    "Actuator",
    "ActuatorError",
    "AlertmanagerActuator",
    "ApplyReport",
    "CommandActuator",
    "SwitchChange",
    "SwitchService",
    "WebhookActuator",
    "build_actuators",
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
    data = read_state_file(path)
    value = data.get("generation") if data else None
    return value if isinstance(value, int) else -1


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    lock = path.with_name(f".{path.name}.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def write_state_file(path: Path, state: dict[str, Any]) -> bool:
    """Atomically replace `path` with `state` as JSON: a temp file in the same directory,
    fsync, rename, fsync of the directory. Writers serialise on a lock file beside it and
    never replace a higher generation (a slow writer cannot move production backwards);
    returns False when it skipped for that reason."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = (json.dumps(state, indent=2, sort_keys=True) + "\n").encode()
    with _file_lock(path):
        if _file_generation(path) > int(state["generation"]):
            return False
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


def build_actuators(
    config: SwitchConfig, clock: Callable[[], datetime] | None = None
) -> list[Actuator]:
    """The configured hooks, in the order they run: command, webhook, Alertmanager."""
    actuators: list[Actuator] = []
    if config.command is not None:
        actuators.append(CommandActuator(config.command))
    if config.webhook is not None:
        actuators.append(WebhookActuator(config.webhook))
    if config.alertmanager is not None:
        actuators.append(AlertmanagerActuator(config.alertmanager, clock or _utcnow))
    return actuators


def _utcnow() -> datetime:
    return datetime.now(UTC)


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

    def _change(
        self, events: Sequence[SwitchEvent], now: datetime, actor: str = ""
    ) -> SwitchChange:
        floor = _file_generation(self.state_file)

        def decide(state: SwitchState, history: list[Evaluation]) -> SwitchOutcome:
            # A state file from an earlier database (or written while it was away) may
            # carry a higher generation: continue above it so the file never goes back.
            start = state
            if floor > state.generation:
                start = replace(state, generation=floor)
            outcome = step(start, history, self.policy, now=now, events=events)
            if not outcome.transitions:
                return SwitchOutcome(state, (), outcome.refused)
            return outcome

        outcome = self.store.change_switch(decide, now=now, history=self._history(), actor=actor)
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
        report = self.apply(outcome.state) if outcome.transitions else self.ensure_applied()
        self.export_metrics(outcome.state)
        return SwitchChange(outcome, report)

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
        delay = actuator.backoff_s
        error = ""
        for attempt in range(actuator.retries + 1):
            if attempt:
                self.sleep(delay)
                delay *= 2
            try:
                actuator.apply(state)
            except ActuatorError as exc:
                error = exc.reason
            except Exception as exc:  # a hook bug must not stop the others
                error = f"{type(exc).__name__}: {exc}"
            else:
                return None
            if self.metrics is not None:
                self.metrics.actuator_failed(actuator.name)
            log.error(
                "switch.actuator_failed",
                actuator=actuator.name,
                attempt=attempt + 1,
                of=actuator.retries + 1,
                generation=state["generation"],
                error=error,
            )
        return error

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
        None when nothing was needed. Alertmanager is re-pushed while rolled back."""
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
