"""The rollback switch: the state file production reads, the hooks that mirror it, the
kill switch while the database is down, and the service that changes and applies it.

`statefile` owns `switch.json` and its atomic write, `actuators` the command, webhook and
Alertmanager hooks, `delivery` sending states to them in generation order, `emergency`
the database-down rollback and its adoption, `service` the `SwitchService` that ties the
policy, the store and the actuators together.
"""

from __future__ import annotations

from canaryd.errors import ActuatorError
from canaryd.switch.actuators import (
    ALERT_NAME,
    Actuator,
    AlertmanagerActuator,
    CommandActuator,
    WebhookActuator,
    build_actuators,
    sign,
)
from canaryd.switch.emergency import (
    EMERGENCY_REASON_PREFIX,
    SYNCED_NOTE,
    EmergencyRollback,
    adoptable_state,
    emergency_rollback,
)
from canaryd.switch.service import ApplyReport, SwitchChange, SwitchService
from canaryd.switch.statefile import (
    CONFIRMED_AT,
    PENDING_SYNC,
    STATE_FILE_ACTUATOR,
    read_state_file,
    shows,
    state_object,
    without_freshness,
    write_state_file,
)

__all__ = [
    "ALERT_NAME",
    "CONFIRMED_AT",
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
    "shows",
    "sign",
    "state_object",
    "without_freshness",
    "write_state_file",
]
