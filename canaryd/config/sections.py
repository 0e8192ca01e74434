"""The sections of canaryd's configuration, one pydantic model each: arms, prompts,
storage, schedule, rollout, server, traffic, retention, logging and the switch with its hooks
(`Settings` in `canaryd.config.settings` puts them together; storage, the switch and
logging, which `canaryd switch` reads alone, are declared in `canaryd.config.switching`).
Every section forbids unknown keys and non-finite numbers and bounds its durations and
counts (`engine.bounds`).
"""

from __future__ import annotations

import re
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from canaryd.config.switching import Section as _Section
from engine.config import EngineConfig, SpeculativeConfig, TransformersEngineConfig
from gates.records import BASELINE_ARM, DEFAULT_ARM

# False while `load_settings(require_secrets=False)` validates: a command that uses no
# secret (the switch, status, gates) must run in a shell without the service's
# EnvironmentFile, so the checks that a secret is set are skipped there.
SECRETS_REQUIRED: ContextVar[bool] = ContextVar("canaryd_secrets_required", default=True)


ARM_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def _default_speculative_arm() -> dict[str, Any]:
    """The speculative arm a configuration without one gets: prompt lookup, 8 tokens."""
    return TransformersEngineConfig(speculative=SpeculativeConfig()).model_dump()


class ArmsConfig(_Section):
    """The arms of every pair: `baseline` (plain decoding) and any number of speculative
    arms, one `[arms.<name>]` table each, all sent the same prompt with the same sampling.
    With no speculative arm configured there is one, `speculative`: the embedded model
    with transformers prompt lookup and 8 draft tokens; the baseline defaults to the
    embedded model decoding autoregressively."""

    model_config = ConfigDict(extra="allow")

    baseline: EngineConfig = Field(default_factory=TransformersEngineConfig)
    # Every other key is a speculative arm, named by its key.
    __pydantic_extra__: dict[str, EngineConfig] = Field(init=False)

    @model_validator(mode="before")
    @classmethod
    def _named_arms(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name in data:
            if not ARM_NAME_PATTERN.match(str(name)):
                raise ValidationError.from_exception_data(
                    "ArmsConfig",
                    [
                        InitErrorDetails(
                            type=PydanticCustomError(
                                "arm_name",
                                "an arm name is a lower-case letter, then up to 31 "
                                "lower-case letters, digits or underscores",
                            ),
                            loc=(str(name),),
                            input=str(name),
                        )
                    ],
                )
        if not set(data) - {BASELINE_ARM}:
            data = {**data, DEFAULT_ARM: _default_speculative_arm()}
        return data

    @property
    def speculative_arms(self) -> dict[str, EngineConfig]:
        """The speculative arms by name, in the order the configuration gives them."""
        return dict(self.__pydantic_extra__ or {})

    @property
    def names(self) -> list[str]:
        """Every arm: `baseline` first, then the speculative arms."""
        return [BASELINE_ARM, *self.speculative_arms]

    def arm(self, name: str) -> EngineConfig:
        """The configuration of the arm called `name` (KeyError for an unknown one)."""
        return self.baseline if name == BASELINE_ARM else self.speculative_arms[name]


class PromptsConfig(_Section):
    suites: list[Path] = Field(
        default_factory=list,
        description="suite files or directories; empty: the suites shipped with canaryd",
    )
    categories: list[str] = Field(
        default_factory=list, description="only these categories; empty: all"
    )
    category_weights: dict[str, float] = Field(
        default_factory=dict, description="relative sampling weight per category (default 1)"
    )
    max_tokens: int | None = Field(
        default=None, ge=1, le=8192, description="override every prompt's max_tokens"
    )
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="0: greedy")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int = Field(default=0, description="seeds prompt sampling and arm order")
    seed_per_arm: bool = Field(
        default=True,
        description="sampled pairs: each arm samples with its own seed (derived from the "
        "pair's stored seed and the arm's name), so a lossless pair's two outputs are "
        "independent draws and exactly exchangeable, as the quality gate's sign-flip test "
        "assumes; false: one seed for every arm (the arms share their first sampled "
        "tokens, but the test's exchangeability is then assumed, not guaranteed)",
    )
    timeout_s: float = Field(default=120.0, gt=0, description="per generation")

    @field_validator("category_weights")
    @classmethod
    def _non_negative(cls, weights: dict[str, float]) -> dict[str, float]:
        for category, weight in weights.items():
            if weight < 0:
                raise ValueError(f"weight of {category!r} is negative")
        return weights


def pairs_per_minute(pairs: int, interval_s: float) -> float:
    """The pair rate of `pairs` pairs every `interval_s` seconds: the one rule behind the
    schedule's rate, the daemon's pace, the verdict's estimate and the burst allowance."""
    return 60.0 * pairs / interval_s


def interval_for(pairs: int, per_minute: float) -> float:
    """The inverse rule: the seconds between cycles of `pairs` pairs that run `per_minute`
    pairs a minute."""
    return 60.0 * pairs / per_minute


class ScheduleConfig(_Section):
    pair_interval_s: float = Field(default=30.0, gt=0, description="seconds between pair cycles")
    jitter_s: float = Field(default=5.0, ge=0, description="random delay added to each cycle")
    pairs_per_cycle: int = Field(default=1, ge=1, le=1000)
    misfire_grace_s: float = Field(default=60.0, gt=0)
    gate_interval_s: float = Field(default=60.0, gt=0, description="seconds between gate runs")
    max_pairs_per_minute: float | None = Field(
        default=6.0,
        gt=0,
        description="while an enforce detector is past `speed_up_at` of its threshold, "
        "pairs run at this rate (when faster than pair_interval_s) until it decides; "
        "null: never faster. Above 60 / gates.budget.design_pair_interval_s it spends "
        "more of the false-alarm budget than designed",
    )
    speed_up_at: float = Field(
        default=0.25,
        gt=0,
        lt=1,
        description="the share of a detector's threshold (CUSUM / h) that speeds pairs up",
    )
    retention_interval_s: float = Field(default=3600.0, gt=0)
    probe_interval_s: float = Field(
        default=3600.0,
        ge=0,
        description="seconds between capability probes (`canaryd probe`) of the baseline "
        "and the switch's arm, when both are OpenAI-compatible servers; 0: never",
    )
    heartbeat_interval_s: float = Field(default=10.0, gt=0)
    shutdown_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="on SIGTERM, how long the in-flight pair may take to finish before it "
        "is dropped whole; a generation in progress cannot be interrupted",
    )

    @property
    def pairs_per_minute(self) -> float:
        """The rate the schedule runs pairs at, jitter and the adaptive pace aside."""
        return pairs_per_minute(self.pairs_per_cycle, self.pair_interval_s)


class RolloutConfig(_Section):
    """The rollout burst: while a rollout tool is judging a revision (a `POST /v1/verdict`
    or a Flagger hook named it within `burst_hold_s`), pairs run faster than the schedule,
    several at once, until its verdict decides (PASS or FAIL); then the schedule again.
    And how much new evidence a traffic increase needs (`increase_evidence_share`)."""

    max_pairs_per_minute: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="pair rate while a revision is being judged (a burst); at most the "
        "burst allowance per 30 days: 30 days / gates.budget.design_pair_interval_s less "
        "the pairs the schedule runs (docs/progressive-delivery.md)",
    )
    concurrency: int = Field(
        default=4,
        ge=1,
        le=64,
        description="pairs run at once during a burst (each on every arm: both arms "
        "carry the same extra load, so paired latency ratios stay comparable)",
    )
    burst_hold_s: float = Field(
        default=120.0,
        gt=0,
        description="a burst lasts while a verdict request or Flagger hook named the "
        "revision within this many seconds (and its verdict is undecided)",
    )
    max_pairs_per_revision_hour: int = Field(
        default=600,
        ge=1,
        description="burst pairs one revision may run in any hour (20 minutes at the "
        "default rate); past it that revision runs on the schedule until the hour frees up",
    )
    max_revisions_per_hour: int = Field(
        default=6,
        ge=1,
        description="distinct revisions that may start a burst in any hour; a further one "
        "is judged on the schedule's pairs until the hour frees up",
    )
    increase_evidence_share: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="Flagger's confirm-traffic-increase: a weight step needs, measured on "
        "the revision since the last one, this share of each of the error, latency and "
        "quality gates' min_samples in new pairs (production requests where a telemetry "
        "gate covers the gate), besides each of them deciding something (not NODATA)",
    )


class ServerConfig(_Section):
    listen: str = Field(
        default="127.0.0.1:9466",
        description="host:port of /metrics, /healthz, /readyz (port 0: any free port)",
    )
    auth_token: SecretStr | None = Field(
        default=None,
        description="when set, /v1/verdict and the Flagger webhooks need "
        "`Authorization: Bearer <token>` (Flagger: `token` in the webhook's `metadata`); "
        "unset on a listen address that is not loopback, POST /v1/verdict and the Flagger "
        "webhooks (they start a rollout burst) answer 403. Set it from an EnvironmentFile "
        "as CANARYD_SERVER__AUTH_TOKEN, never in the TOML",
    )
    max_cycle_age_s: float | None = Field(
        default=None,
        gt=0,
        description="/healthz fails when the last finished cycle is older; default "
        "3 x pair_interval_s + 2 x timeout_s",
    )

    @field_validator("listen")
    @classmethod
    def _host_port(cls, listen: str) -> str:
        host, sep, port = listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError("must be host:port, e.g. 127.0.0.1:9466")
        return listen


# A live category is named like a suite's (canaryd.pairs.suites.CATEGORY_PATTERN).
_LIVE_CATEGORY_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,31}")


class TrafficConfig(_Section):
    """The mirror sink: live production requests, copied by a gateway (nginx `mirror`,
    Envoy `request_mirror_policies`, Istio `mirror`), replayed as live pairs beside the
    suites. No `listen`: no sink, suites only."""

    listen: str | None = Field(
        default=None,
        description="host:port of the mirror sink (POST /v1/chat/completions, "
        "/v1/completions; port 0: any free port); unset: no sink",
    )
    category_header: str = Field(
        default="X-Canaryd-Category",
        pattern=r"^[A-Za-z0-9-]{1,64}$",
        description="request header the gateway sets (stripping the client's) to name a "
        "live request's category; only values listed in `categories` count. The body's "
        "`model` and the path never name one",
    )
    categories: list[str] = Field(
        default_factory=list,
        max_length=1000,
        description="the live categories the gateway's header may name (lower-case "
        "letter, then up to 31 lower-case letters, digits or underscores); any other "
        "value, or none, is `unknown_category`. Empty: every live request is `live`",
    )
    unknown_category: Literal["live", "refuse"] = Field(
        default="live",
        description="a request whose header names no listed category: `live` (the generic "
        "live category) or `refuse` (answered 422, counted `unlisted`, never sampled)",
    )
    auth_token: SecretStr | None = Field(
        default=None,
        description="when set, the sink needs `Authorization: Bearer <token>` (401 "
        "otherwise); unset: listen on an address only the gateway reaches. From an "
        "EnvironmentFile as CANARYD_TRAFFIC__AUTH_TOKEN",
    )
    hash_key: SecretStr | None = Field(
        default=None,
        min_length=16,
        description="HMAC-SHA256 key that names a live prompt in the store instead of "
        "its text; required with `listen`. From an EnvironmentFile as "
        "CANARYD_TRAFFIC__HASH_KEY (e.g. `openssl rand -hex 32`); a new key makes every "
        "prompt new",
    )
    live_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="share of pairs drawn from live requests (the treatment) while any "
        "are queued; the rest, and every pair while none is, from the suites (the control)",
    )
    max_prompts_per_minute: int = Field(
        default=6, ge=1, le=10_000, description="live requests sampled per minute, in all"
    )
    max_per_category_per_minute: int = Field(
        default=2, ge=1, le=10_000, description="live requests sampled per minute per category"
    )
    max_categories: int = Field(
        default=32,
        ge=1,
        le=1000,
        description="live categories per minute; requests of more are counted, not sampled",
    )
    queue_size: int = Field(
        default=64, ge=1, le=100_000, description="sampled requests waiting for a pair"
    )
    dedup_window_s: float = Field(
        default=3600.0, ge=0, description="a prompt seen again within this is not sampled"
    )
    max_prompt_chars: int = Field(
        default=16_000, ge=1, description="longer prompts are counted, not sampled"
    )
    max_tokens: int = Field(
        default=512, ge=1, le=8192, description="cap on a live request's own max_tokens"
    )
    max_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        le=64 * 1024 * 1024,
        description="larger request bodies are answered 413 unread",
    )
    store_text: bool = Field(
        default=False,
        description="store live prompts' and outputs' text (kept retention.live_text_days); "
        "false: a keyed hash, token counts and figures only",
    )
    redact_headers: list[str] = Field(
        default_factory=lambda: ["authorization", "cookie", "proxy-authorization", "x-api-key"],
        description="headers whose values the sink never shows (a rejected request's log "
        "line names only the other headers' values)",
    )

    @field_validator("listen")
    @classmethod
    def _host_port(cls, listen: str | None) -> str | None:
        return None if listen is None else ServerConfig._host_port(listen)

    @field_validator("categories")
    @classmethod
    def _category_names(cls, categories: list[str]) -> list[str]:
        for category in categories:
            if not _LIVE_CATEGORY_PATTERN.fullmatch(category):
                raise ValueError(
                    f"{category[:40]!r} is not a category name: a lower-case letter, then "
                    "up to 31 lower-case letters, digits or underscores"
                )
        return list(dict.fromkeys(categories))

    @model_validator(mode="after")
    def _keyed(self) -> TrafficConfig:
        if self.listen is not None and self.hash_key is None and SECRETS_REQUIRED.get():
            raise ValidationError.from_exception_data(
                "TrafficConfig",
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "hash_key",
                            "required when traffic.listen is set: live prompts are stored as "
                            "a keyed hash; set CANARYD_TRAFFIC__HASH_KEY in the EnvironmentFile "
                            "(e.g. `openssl rand -hex 32`), never in the TOML",
                        ),
                        loc=("hash_key",),
                        input=None,
                    )
                ],
            )
        return self

    @model_validator(mode="after")
    def _categories_fit(self) -> TrafficConfig:
        wanted = len(self.categories) + (self.unknown_category == "live")
        if wanted > self.max_categories:
            raise ValidationError.from_exception_data(
                "TrafficConfig",
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "categories",
                            "{wanted} live categories (the listed ones, and `live` for the "
                            "rest) exceed traffic.max_categories = {cap}: raise "
                            "max_categories or list fewer",
                            {"wanted": wanted, "cap": self.max_categories},
                        ),
                        loc=("categories",),
                        input=self.categories,
                    )
                ],
            )
        return self

    @property
    def enabled(self) -> bool:
        return self.listen is not None


class RetentionConfig(_Section):
    live_text_days: float = Field(
        default=7.0,
        gt=0,
        description="with traffic.store_text, live prompts' and outputs' text is erased "
        "after this many days (their figures stay, as storage.raw_retention_days says)",
    )
