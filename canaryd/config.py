"""canaryd's one configuration model: a TOML file plus `CANARYD_` environment overrides.

`load_settings(path)` reads the file named by `--config` or `CANARYD_CONFIG`, else
`/etc/canaryd/canaryd.toml` when it exists (none: all defaults, which run the embedded
model on both arms), so that an operator's command and the service read the same file
without being told; it applies environment overrides
(`CANARYD_STORAGE__URL=...`, `__` for nesting) and validates everything at once. A bad
file fails with the file, the key and the reason (`ConfigError`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from canaryd import paths
from canaryd.errors import ConfigError
from canaryd.redact import redact_value
from canaryd.store.database import mask_url
from engine.bounds import check_bounds
from engine.config import EngineConfig, SpeculativeConfig, TransformersEngineConfig
from gates import GateMode, GatesConfig
from gates.records import BASELINE_ARM, DEFAULT_ARM

CONFIG_ENV = "CANARYD_CONFIG"
DATABASE_URL_ENV = "CANARYD_DATABASE_URL"
# The file the systemd unit runs with; read by every command that names no other.
DEFAULT_CONFIG_PATH = Path("/etc/canaryd/canaryd.toml")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    _bounded = field_validator("*")(check_bounds)


ARM_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# A revision names what a speculative arm serves: 1 to 128 printable ASCII characters
# without spaces (a pod-template hash, a Flagger checksum, a git sha, an image digest).
REVISION_PATTERN = r"^[!-~]{1,128}$"


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


class StorageConfig(_Section):
    url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; unset: env CANARYD_DATABASE_URL, else "
        "sqlite:///$CANARYD_DATA_DIR/canaryd.db. "
        "PostgreSQL: postgresql+psycopg://user:password@host/db",
    )

    buffer_pairs: int = Field(
        default=1000,
        ge=1,
        # Each pair holds both outputs' text and token ids (tens of kB at max_tokens):
        # the bound keeps a long outage from growing the daemon without limit.
        le=100_000,
        description="pairs kept in memory while the database is unreachable; when full, "
        "the oldest is dropped and counted",
    )
    raw_retention_days: float = Field(
        default=30.0, gt=0, description="raw pairs older than this are rolled up and removed"
    )
    rollup_retention_days: float = Field(
        default=365.0, gt=0, description="per-hour roll-ups older than this are removed"
    )

    @model_validator(mode="after")
    def _rollups_outlive_raw_rows(self) -> StorageConfig:
        if self.rollup_retention_days < self.raw_retention_days:
            raise ValueError("rollup_retention_days must be at least raw_retention_days")
        return self

    def resolved_url(self, explicit: str | None = None) -> str:
        """The database every command, the daemon and the gates use: `explicit` (a
        command's `--url`), else `storage.url` (the config file, or CANARYD_STORAGE__URL),
        else env CANARYD_DATABASE_URL, else the SQLite file in the data directory."""
        return (
            explicit or self.url or os.environ.get(DATABASE_URL_ENV) or paths.default_database_url()
        )


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


class ServerConfig(_Section):
    listen: str = Field(
        default="127.0.0.1:9466",
        description="host:port of /metrics, /healthz, /readyz (port 0: any free port)",
    )
    auth_token: SecretStr | None = Field(
        default=None,
        description="when set, /v1/verdict and the Flagger webhooks need "
        "`Authorization: Bearer <token>` (Flagger: `?token=` on the webhook URL); set it "
        "from an EnvironmentFile as CANARYD_SERVER__AUTH_TOKEN, never in the TOML",
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
        description="request header naming a live request's category; else its `model`, "
        "else its route prefix (`/<route>/v1/...`), else `live`",
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

    @model_validator(mode="after")
    def _keyed(self) -> TrafficConfig:
        if self.listen is not None and self.hash_key is None:
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


class LoggingConfig(_Section):
    level: str = Field(default="INFO", pattern="^(DEBUG|INFO|WARNING|ERROR)$")
    format: str = Field(
        default="auto",
        pattern="^(auto|json|console)$",
        description="auto: JSON under systemd/journald or when stderr is not a "
        "terminal, console on a terminal",
    )
    include_text: bool = Field(
        default=False, description="log prompt and output text (may be sensitive)"
    )


class _Retried(_Section):
    """How an actuator retries: `retries` more attempts after the first, waiting
    `backoff_s`, then twice that, and so on."""

    timeout_s: float = Field(default=10.0, gt=0, description="per attempt")
    retries: int = Field(default=2, ge=0, le=10, description="attempts after the first")
    backoff_s: float = Field(default=1.0, ge=0, description="first wait; doubles each retry")


class CommandHookConfig(_Retried):
    """A command run after every switch change, with the state in CANARYD_SWITCH_* env."""

    argv: list[str] = Field(min_length=1, description="program and arguments (no shell)")


class WebhookConfig(_Retried):
    """POST of the state object as JSON, signed with HMAC-SHA256 when a secret is set."""

    url: str = Field(description="http(s) URL that receives the POST")
    secret: SecretStr | None = Field(default=None, description="shared HMAC secret")
    secret_env: str | None = Field(default=None, description="environment variable to read")
    secret_file: Path | None = Field(default=None, description="file whose content is the secret")
    retries: int = Field(default=3, ge=0, le=10, description="attempts after the first")
    backoff_s: float = Field(default=0.5, ge=0, description="first wait; doubles each retry")

    @model_validator(mode="after")
    def _one_secret_source(self) -> WebhookConfig:
        sources = [self.secret is not None, bool(self.secret_env), self.secret_file is not None]
        if sum(sources) > 1:
            raise ValueError("set at most one of secret, secret_env, secret_file")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        return self


class AlertmanagerConfig(_Retried):
    """Alerts pushed to Alertmanager's API v2 while the switch is rolled back."""

    url: str = Field(description="Alertmanager root, e.g. http://127.0.0.1:9093")
    labels: dict[str, str] = Field(
        default_factory=dict, description="extra labels on the alert (e.g. env, cluster)"
    )
    resend_s: float = Field(
        default=60.0, gt=0, description="re-push interval while rolled back (keeps it firing)"
    )

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {url!r}")
        return url.rstrip("/")


class SwitchConfig(_Section):
    """The rollback switch's mirror for production and its optional actuators."""

    state_file: Path | None = Field(
        default=None,
        description="JSON file production reads; default $CANARYD_DATA_DIR/switch.json",
    )
    arm: str | None = Field(
        default=None,
        description="the speculative arm whose rollback the switch controls; the other "
        "speculative arms are comparison arms (measured, gated and reported, never "
        "switching). Unset: the only speculative arm (required when there are several)",
    )
    revision: str | None = Field(
        default=None,
        pattern=REVISION_PATTERN,
        description="the revision the switch's arm serves (a pod-template hash, a Flagger "
        "checksum, a git sha): /v1/verdict and the Flagger webhooks answer NODATA for any "
        "other. Unset: a request that names a revision never named before declares that "
        "the arm now serves it",
    )
    command: CommandHookConfig | None = None
    webhook: WebhookConfig | None = None
    alertmanager: AlertmanagerConfig | None = None

    def resolved_state_file(self) -> Path:
        """The state file every command, the daemon and the gates write: `state_file`
        (the config file, or CANARYD_SWITCH__STATE_FILE), else `switch.json` in the data
        directory."""
        return (self.state_file or paths.data_dir() / "switch.json").expanduser()


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CANARYD_",
        env_nested_delimiter="__",
        extra="ignore",
        nested_model_default_partial_update=True,
        allow_inf_nan=False,
    )

    arms: ArmsConfig = Field(default_factory=ArmsConfig)
    prompts: PromptsConfig = Field(default_factory=PromptsConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    gates: GatesConfig = Field(default_factory=GatesConfig)
    switch: SwitchConfig = Field(default_factory=SwitchConfig)
    traffic: TrafficConfig = Field(default_factory=TrafficConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)

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

    @property
    def switch_arm(self) -> str:
        """The speculative arm whose rollback the switch controls (`switch.arm`, else the
        only one)."""
        return self.switch.arm or next(iter(self.arms.speculative_arms))

    @property
    def comparison_arms(self) -> list[str]:
        """The speculative arms other than `switch_arm`: measured, never switching."""
        return [name for name in self.arms.speculative_arms if name != self.switch_arm]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The TOML file arrives through init_settings (load_settings parses it, so that
        # syntax errors can name their line); the environment overrides the file.
        return env_settings, init_settings

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


_TOP_LEVEL_KEYS = set(Settings.model_fields)


def config_path(explicit: Path | None) -> Path | None:
    """`--config`, else `CANARYD_CONFIG` (set but empty: no file), else
    `DEFAULT_CONFIG_PATH` when it exists, else no file (all defaults)."""
    if explicit is not None:
        return explicit
    env = os.environ.get(CONFIG_ENV)
    if env is not None:
        return Path(env) if env else None
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None


_ENGINE_TAGS = frozenset({"transformers", "fake", "openai"})


def _key(loc: tuple[int | str, ...]) -> str:
    # Drop the discriminator tag pydantic inserts after an arm's name ("transformers", ...);
    # an arm may itself be called like a tag, so only the one in that place goes.
    parts = [str(p) for p in loc]
    if len(parts) > 2 and parts[0] == "arms" and parts[2] in _ENGINE_TAGS:
        del parts[2]
    return ".".join(parts) or "(top level)"


def load_settings(path: Path | None = None) -> Settings:
    """Load and validate the configuration; raise `ConfigError` naming file and key."""
    path = config_path(path)
    data: dict[str, Any] = {}
    source = str(path) if path else "environment (CANARYD_*)"
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(path, "(file)", "no such file") from None
        except OSError as exc:
            raise ConfigError(path, "(file)", f"cannot read: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(path, "(syntax)", str(exc)) from exc
        unknown = sorted(set(data) - _TOP_LEVEL_KEYS)
        if unknown:
            raise ConfigError(
                path,
                unknown[0],
                "unknown section; expected one of " + ", ".join(sorted(_TOP_LEVEL_KEYS)),
            )
    try:
        return Settings(**data)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        value = (
            f" (got {first['input']!r})"
            if first["type"] != "missing" and not isinstance(first["input"], dict | None)
            else ""
        )
        key = _key(first["loc"])
        variable = _env_variable(key)
        if variable is not None:  # the environment overrides the file: name what to fix
            source = f"environment {variable}"
        message = first["msg"].removeprefix("Value error, ")
        raise ConfigError(source, key, f"{message}{value}{more}") from None


def _env_variable(key: str) -> str | None:
    """The `CANARYD_…` variable that set `key`, when one is set (names are not case
    sensitive, as pydantic-settings reads them)."""
    wanted = "CANARYD_" + key.replace(".", "__").upper()
    return next((name for name in os.environ if name.upper() == wanted), None)
