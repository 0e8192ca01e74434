"""`Settings`: canaryd's one configuration model, the sections of
`canaryd.config.sections` plus the gates' (`gates.GatesConfig`) and production telemetry's
(`canaryd.telemetry.config.TelemetryConfig`), read from a TOML file and
`CANARYD_` environment overrides (`__` for nesting), with the snapshot and hash a run
stores."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import (
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from canaryd.config.environment import EnvironmentSettings
from canaryd.config.sections import (
    ArmsConfig,
    PromptsConfig,
    RetentionConfig,
    RolloutConfig,
    ScheduleConfig,
    ServerConfig,
    TrafficConfig,
    interval_for,
)
from canaryd.config.switching import LoggingConfig, StorageConfig, SwitchConfig
from canaryd.redact import redact_value
from canaryd.store.database import mask_url
from canaryd.telemetry.config import TelemetryConfig
from gates import GateMode, GatesConfig
from gates.records import BASELINE_ARM
from gates.stats.budget import design_pairs_per_minute


class Settings(EnvironmentSettings):
    """Every section, validated at once, read from the TOML file and `CANARYD_` variables
    under `EnvironmentSettings`' rules."""

    arms: ArmsConfig = Field(default_factory=ArmsConfig)
    prompts: PromptsConfig = Field(default_factory=PromptsConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    gates: GatesConfig = Field(default_factory=GatesConfig)
    switch: SwitchConfig = Field(default_factory=SwitchConfig)
    traffic: TrafficConfig = Field(default_factory=TrafficConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)

    @model_validator(mode="after")
    def _switch_arm_is_speculative(self) -> Settings:
        arms = list(self.arms.speculative_arms)
        name = self.switch.arm
        if name is None and len(arms) > 1:
            problem = (
                f"unset, but there are {len(arms)} speculative arms ({', '.join(arms)}): "
                "name the one whose rollback the switch controls"
            )
        elif name is not None and name not in arms:
            problem = f"names no speculative arm; expected one of {', '.join(arms)}"
        else:
            return self
        raise ValidationError.from_exception_data(
            "Settings",
            [
                InitErrorDetails(
                    type=PydanticCustomError("switch_arm", problem),
                    loc=("switch", "arm"),
                    input=name,
                )
            ],
        )

    @model_validator(mode="after")
    def _control_arm_is_an_extra_arm(self) -> Settings:
        name = self.gates.quality.control_arm
        if name is None or (name in self.arms.speculative_arms and name != self.switch_arm):
            return self
        raise ValidationError.from_exception_data(
            "Settings",
            [
                InitErrorDetails(
                    type=PydanticCustomError(
                        "control_arm",
                        "names no extra arm; configure [arms.{name}] exactly like the "
                        "baseline (no speculation) and set switch.arm to the speculative "
                        "arm it is not",
                        {"name": name},
                    ),
                    loc=("gates", "quality", "control_arm"),
                    input=name,
                )
            ],
        )

    @model_validator(mode="after")
    def _telemetry_arms_are_arms(self) -> Settings:
        known = self.arms.names
        unknown = [name for name in self.telemetry.arms if name not in known]
        baseline = self.telemetry.arms.get(BASELINE_ARM)
        if baseline is not None and baseline.stable is not None:
            raise ValidationError.from_exception_data(
                "Settings",
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "telemetry_stable",
                            "the baseline has no stable: a concurrent stable belongs to a "
                            "speculative arm (the pods serving its previous revision)",
                        ),
                        loc=("telemetry", "arms", BASELINE_ARM, "stable"),
                        input=BASELINE_ARM,
                    )
                ],
            )
        if not unknown:
            return self
        raise ValidationError.from_exception_data(
            "Settings",
            [
                InitErrorDetails(
                    type=PydanticCustomError(
                        "telemetry_arm",
                        "names no arm of [arms]; expected one of {known}",
                        {"known": ", ".join(known)},
                    ),
                    loc=("telemetry", "arms", unknown[0]),
                    input=unknown[0],
                )
            ],
        )

    @model_validator(mode="after")
    def _enforced_parity_is_probed(self) -> Settings:
        if self.gates.parity.mode is not GateMode.ENFORCE:
            return self
        servers = [
            name for name in (BASELINE_ARM, self.switch_arm) if self.arms.arm(name).kind != "openai"
        ]
        if self.schedule.probe_interval_s > 0 and not servers:
            return self
        why = (
            f"arms {', '.join(servers)} are not OpenAI-compatible servers"
            if servers
            else "schedule.probe_interval_s = 0 turns the probe off"
        )
        raise ValidationError.from_exception_data(
            "Settings",
            [
                InitErrorDetails(
                    type=PydanticCustomError(
                        "parity_unprobed",
                        "enforce needs the daemon's capability probe, but {why}: the gate "
                        "would stay NODATA and hold every restore back; set mode = "
                        '"warn", or probe servers (kind = "openai", probe_interval_s > 0)',
                        {"why": why},
                    ),
                    loc=("gates", "parity", "mode"),
                    input=self.gates.parity.mode.value,
                )
            ],
        )

    @model_validator(mode="after")
    def _schedule_within_design_rate(self) -> Settings:
        budget = self.gates.budget
        if budget.over_design_rate == "rebudget":
            return self
        schedule = self.schedule
        rate = schedule.pairs_per_minute
        design = design_pairs_per_minute(self.gates)
        if rate <= design * (1 + 1e-9):
            return self
        key = "pairs_per_cycle" if schedule.pairs_per_cycle > 1 else "pair_interval_s"
        ratio = rate / design
        problem = (
            f"schedule.pairs_per_cycle = {schedule.pairs_per_cycle} every "
            f"schedule.pair_interval_s = {schedule.pair_interval_s:g} s is {rate:.3g} pairs a "
            f"minute, {ratio:.3g}x the {design:.3g} the false-alarm budget is sized for "
            f"(gates.budget.design_pair_interval_s = {budget.design_pair_interval_s:g} s): "
            "slow the schedule (pair_interval_s >= "
            f"{schedule.pairs_per_cycle * budget.design_pair_interval_s:.3g}), or re-budget "
            "with gates.budget.design_pair_interval_s = "
            f"{interval_for(1, rate):.3g} (every detector threshold rises by "
            f"log({ratio:.3g}) nats) or gates.budget.over_design_rate = "
            '"rebudget" (the gates re-budget from the measured rate)'
        )
        raise ValidationError.from_exception_data(
            "Settings",
            [
                InitErrorDetails(
                    type=PydanticCustomError("over_design_rate", problem),
                    loc=("schedule", key),
                    input=getattr(schedule, key),
                )
            ],
        )

    @property
    def switch_arm(self) -> str:
        """The speculative arm whose rollback the switch controls (`switch.arm`, else the
        only one)."""
        return self.switch.arm or next(iter(self.arms.speculative_arms))

    @property
    def comparison_arms(self) -> list[str]:
        """The speculative arms other than `switch_arm`: measured, never switching."""
        return [name for name in self.arms.speculative_arms if name != self.switch_arm]

    def snapshot(self) -> dict[str, Any]:
        """The effective configuration, JSON-safe, as stored with every run: secrets
        masked (`SecretStr` fields, the database password), so the runs table can be
        readable by dashboards."""
        data: dict[str, Any] = json.loads(self.model_dump_json())
        if data.get("storage", {}).get("url"):
            data["storage"]["url"] = mask_url(data["storage"]["url"])
        redacted: dict[str, Any] = redact_value(data)  # e.g. credentials in a base_url
        return redacted

    def config_hash(self) -> str:
        canonical = json.dumps(self.snapshot(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]
