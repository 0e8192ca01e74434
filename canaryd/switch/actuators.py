"""The switch's hooks: the `Actuator` protocol, the command, webhook and Alertmanager
actuators built from `[switch]`, and running one with its retries.

An actuator tells something outside canaryd about a switch state and raises
`ActuatorError` when it cannot; `run_actuator` retries it with exponential back-off and
returns the last error instead of raising, so one failed hook never stops the others.
httpx is imported when a hook first posts: the kill switch with only a command hook, or
none, never pays for it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from canaryd.config import AlertmanagerConfig, CommandHookConfig, SwitchConfig, WebhookConfig
from canaryd.errors import ActuatorError
from canaryd.logs import get_logger

if TYPE_CHECKING:
    from canaryd.metrics.switch import SwitchMetrics

__all__ = [
    "ALERT_NAME",
    "COMMAND_ENV_ALLOWLIST",
    "SIGNATURE_HEADER",
    "Actuator",
    "AlertmanagerActuator",
    "CommandActuator",
    "WebhookActuator",
    "actuator_factories",
    "build_actuators",
    "run_actuator",
    "sign",
    "utcnow",
]

log = get_logger("canaryd.switch")

ALERT_NAME = "CanarydSpeculativeRolledBack"
SIGNATURE_HEADER = "X-Canaryd-Signature"
_OUTPUT_TAIL = 300  # characters of a failed command's output kept in the error
# What the command hook inherits from canaryd's environment, and nothing else: the
# daemon's holds the database URL and the webhook secret, which a hook has no use for.
COMMAND_ENV_ALLOWLIST = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
)


def utcnow() -> datetime:
    return datetime.now(UTC)


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
    JSON for the whole object) and only `COMMAND_ENV_ALLOWLIST` from canaryd's own
    environment; a non-zero exit or the timeout is a failure."""

    name = "command"

    def __init__(self, config: CommandHookConfig) -> None:
        self.config = config
        self.retries = config.retries
        self.backoff_s = config.backoff_s

    def apply(self, state: dict[str, Any]) -> None:
        env = {name: os.environ[name] for name in COMMAND_ENV_ALLOWLIST if name in os.environ}
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
    import httpx

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


def actuator_factories(
    config: SwitchConfig, clock: Callable[[], datetime]
) -> list[Callable[[], Actuator]]:
    """One constructor per configured hook, in the order they run; each may raise
    `ActuatorError` (a webhook secret it cannot read)."""
    factories: list[Callable[[], Actuator]] = []
    if (command := config.command) is not None:
        factories.append(lambda: CommandActuator(command))
    if (webhook := config.webhook) is not None:
        factories.append(lambda: WebhookActuator(webhook))
    if (alertmanager := config.alertmanager) is not None:
        factories.append(lambda: AlertmanagerActuator(alertmanager, clock))
    return factories


class _UnbuiltActuator:
    """Stands in for a hook that could not be built (a webhook secret this process cannot
    read): every attempt fails with that reason, so the failure is counted and recorded
    on the switch row like any other, and the state change itself goes ahead."""

    retries = 0
    backoff_s = 0.0

    def __init__(self, error: ActuatorError) -> None:
        self.name = error.actuator
        self.reason = error.reason

    def apply(self, state: dict[str, Any]) -> None:
        raise ActuatorError(self.name, self.reason)

    def keepalive(self, state: dict[str, Any], now: datetime) -> bool:
        return False


def build_actuators(
    config: SwitchConfig,
    clock: Callable[[], datetime] | None = None,
    *,
    on_error: Callable[[ActuatorError], None] | None = None,
) -> list[Actuator]:
    """The configured hooks, in the order they run: command, webhook, Alertmanager.
    Never raises: a hook that cannot be built is logged, passed to `on_error`, and
    replaced by one that fails every attempt with the reason."""
    actuators: list[Actuator] = []
    for make in actuator_factories(config, clock or utcnow):
        try:
            actuators.append(make())
        except ActuatorError as exc:
            log.error("switch.actuator_unbuilt", actuator=exc.actuator, error=exc.reason)
            if on_error is not None:
                on_error(exc)
            actuators.append(_UnbuiltActuator(exc))
    return actuators


def run_actuator(
    actuator: Actuator,
    state: dict[str, Any],
    *,
    metrics: SwitchMetrics | None,
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
