"""The `[telemetry]` configuration: where each arm's production telemetry comes from, and
which of its series give which signal.

Each arm (`[telemetry.arms.<arm>]`, named as in `[arms]`) has one source:
- a direct scrape of Prometheus text expositions: `metrics_url`, one URL or a list of
  them, one per replica (each replica is scraped and the arm's counts are their sum);
- or PromQL against a Prometheus-compatible API: `prometheus_url` with `selector` (label
  matchers naming the arm's series) and, per signal, a query in `queries` that replaces
  the shipped template for the arm's `kind` (`canaryd.telemetry.promql`); a query returns
  cumulative values, whose differences between two scrapes are the interval's counts.
`kind` picks the shipped table of series (`canaryd.telemetry.signals`): `vllm`, `sglang`,
`gateway` (with `gateway = "istio" | "envoy" | "ingress-nginx"`), or `custom`, whose
`[telemetry.arms.<arm>.signals]` names every series itself. On the other kinds `signals`
replaces single entries of the shipped table (an older vLLM's ITL histogram, say). An
arm's `labels` are label matchers every series it reads must satisfy: on an endpoint that
serves several deployments (a gateway, a shared Prometheus federation) they pick the
arm's own series. Label matchers are regular expressions matched against the whole label
value, as PromQL's `=~` does; a plain value matches itself.
"""

from __future__ import annotations

import re
from string import Template
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from canaryd.telemetry.limits import DEFAULT_MAX_BUCKETS, DEFAULT_MAX_SERIES
from engine.bounds import check_bounds

ArmKind = Literal["vllm", "sglang", "gateway", "custom"]
GatewayFlavour = Literal["istio", "envoy", "ingress-nginx"]
CounterSignal = Literal[
    "requests", "errors", "client_errors", "drafts", "draft_tokens", "accepted_tokens"
]
HistogramSignal = Literal["e2e", "ttft", "itl"]
GaugeSignal = Literal["running", "waiting", "acceptance_length", "acceptance_rate"]
Signal = Literal[
    "requests",
    "errors",
    "client_errors",
    "drafts",
    "draft_tokens",
    "accepted_tokens",
    "e2e",
    "ttft",
    "itl",
    "running",
    "waiting",
    "acceptance_length",
    "acceptance_rate",
]
COUNTER_SIGNALS: tuple[CounterSignal, ...] = (
    "requests",
    "errors",
    "client_errors",
    "drafts",
    "draft_tokens",
    "accepted_tokens",
)
HISTOGRAM_SIGNALS: tuple[HistogramSignal, ...] = ("e2e", "ttft", "itl")
GAUGE_SIGNALS: tuple[GaugeSignal, ...] = (
    "running",
    "waiting",
    "acceptance_length",
    "acceptance_rate",
)

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# One PromQL label matcher: a label name, `=`, `!=`, `=~` or `!~`, and a string literal in
# double quotes, single quotes (both with backslash escapes) or backticks (raw).
_MATCHER = (
    r"\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=~|!~|!=|=)\s*"
    r"""(?:"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`[^`]*`)\s*"""
)
_SELECTOR = re.compile(rf"(?:{_MATCHER}(?:,{_MATCHER})*)?")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    _bounded = field_validator("*")(check_bounds)


def _matchers(labels: dict[str, str]) -> dict[str, str]:
    """Label matchers, checked: Prometheus label names, compilable regular expressions."""
    for name, pattern in labels.items():
        if not _LABEL_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a Prometheus label name")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(
                f"label {name!r}: {pattern!r} is not a regular expression: {exc}"
            ) from exc
    return labels


def _http_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
    return url


def _one_or_many(value: Any) -> Any:
    return (value,) if isinstance(value, str) else value


def _replica_urls(urls: tuple[str, ...]) -> tuple[str, ...]:
    for url in urls:
        _http_url(url)
    if len(set(urls)) != len(urls):
        raise ValueError("a replica's URL is listed twice: it would be counted twice")
    return urls


# One URL or a list of them, each http(s) with a host, none twice.
ReplicaUrls = Annotated[
    tuple[str, ...], BeforeValidator(_one_or_many), AfterValidator(_replica_urls)
]


def _api_base_url(url: str) -> str:
    """A Prometheus-compatible API's base URL: http(s), a host, a path base kept (a
    querier behind `/prometheus`), and nothing `/api/v1/query` could not be appended to."""
    parts = urlsplit(_http_url(url))
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise ValueError(
            "a query string or fragment would send every query astray: give the API's base "
            "URL alone (scheme, host and any path before /api/v1; /api/v1/query is appended)"
        )
    if parts.path.rstrip("/").endswith(("/api/v1", "/api/v1/query")):
        raise ValueError(
            "this names the query API itself: give the base URL before /api/v1 "
            "(/api/v1/query is appended)"
        )
    return url


def _selector(selector: str) -> str:
    """PromQL label matchers joined by commas (`name="v"`, `name=~"re"`, `name!="v"`,
    `name!~"re"`), as put inside a template's braces; empty for none."""
    if not _SELECTOR.fullmatch(selector):
        raise ValueError(
            "not a list of PromQL label matchers: write "
            'name="value", name=~"regex", name!="value" or name!~"regex", joined by commas'
        )
    return selector


class SeriesSpec(_Strict):
    """Which samples of an exposition give one signal: the series named `series` whose
    labels match `labels`, summed (a gauge of acceptance: averaged)."""

    series: str = Field(
        description="the sample name as exposed (a counter with or without `_total`, e.g. "
        "`vllm:request_success_total`); a histogram's base name, whose `_bucket` samples "
        "are read"
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="label → regular expression the whole value must match (PromQL `=~`); "
        "only matching series count, and a counter keeps these labels apart while it "
        "checks for resets (every other label is summed away)",
    )
    scale: float = Field(
        default=1.0,
        gt=0,
        description="histograms: seconds per unit of the bucket bounds (`le`); 0.001 for a "
        "histogram in milliseconds (Istio, Envoy)",
    )

    @field_validator("series")
    @classmethod
    def _series_name(cls, series: str) -> str:
        if not _METRIC_NAME.fullmatch(series):
            raise ValueError(f"{series!r} is not a Prometheus metric name")
        return series

    @field_validator("labels")
    @classmethod
    def _label_matchers(cls, labels: dict[str, str]) -> dict[str, str]:
        return _matchers(labels)


class SignalMap(_Strict):
    """Which series give each signal; an unset signal is not read (its value is None).

    Counters: `requests` (finished requests), `errors` (those that failed),
    `client_errors` (those answered 4xx, counted among `requests`: a gateway's status
    codes), and the speculative decoding counters `drafts`, `draft_tokens`,
    `accepted_tokens`.
    Histograms: `e2e`, `ttft`, `itl` (seconds, or `scale`d). Gauges: `running`, `waiting`
    (requests in the batch and in the queue, summed over replicas), and an engine's own
    `acceptance_length` / `acceptance_rate` where it reports no counters (averaged)."""

    requests: SeriesSpec | None = None
    errors: SeriesSpec | None = None
    client_errors: SeriesSpec | None = None
    drafts: SeriesSpec | None = None
    draft_tokens: SeriesSpec | None = None
    accepted_tokens: SeriesSpec | None = None
    e2e: SeriesSpec | None = None
    ttft: SeriesSpec | None = None
    itl: SeriesSpec | None = None
    running: SeriesSpec | None = None
    waiting: SeriesSpec | None = None
    acceptance_length: SeriesSpec | None = None
    acceptance_rate: SeriesSpec | None = None

    def spec(self, signal: Signal) -> SeriesSpec | None:
        value: SeriesSpec | None = getattr(self, signal)
        return value

    def overridden_by(self, other: SignalMap) -> SignalMap:
        """This map with every signal `other` sets explicitly replaced by `other`'s."""
        return self.model_copy(
            update={name: getattr(other, name) for name in other.model_fields_set}
        )


STABLE = "stable"


def stable_source(arm: str) -> str:
    """The name a speculative arm's concurrent stable is scraped, stored and logged under."""
    return f"{arm}@{STABLE}"


def source_arm(source: str) -> str:
    """The arm a source belongs to: `arm` itself, or the arm whose stable it is."""
    return source.removesuffix(f"@{STABLE}")


class StableSource(_Strict):
    """The concurrent stable of a speculative arm (`[telemetry.arms.<arm>.stable]`): the
    pods that still serve the previous revision beside the one judged (Argo's stable
    ReplicaSet, Flagger's primary). Every other setting is the arm's own; this names
    only which series are the stable's: `metrics_url` and/or `labels` for a direct
    scrape, `selector` for PromQL."""

    metrics_url: ReplicaUrls = Field(
        default=(),
        description="direct scrape: the stable replicas' expositions (default: the arm's "
        "own URLs, told apart by `labels`)",
    )
    labels: dict[str, str] | None = Field(
        default=None,
        description="direct scrape: label matchers of the stable's series in place of the "
        "arm's `labels` (a gateway's `destination_workload`, say)",
    )
    selector: str | None = Field(
        default=None,
        max_length=1000,
        description="PromQL: label matchers of the stable's series in place of the arm's "
        '`selector` (Argo: `rollouts_pod_template_hash="<stable hash>"` or the stable '
        'Service; Flagger: `service="<name>-primary"`)',
    )

    @field_validator("selector")
    @classmethod
    def _label_matcher_list(cls, selector: str | None) -> str | None:
        return None if selector is None else _selector(selector)

    @field_validator("labels")
    @classmethod
    def _label_matchers(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        return None if labels is None else _matchers(labels)


class TelemetryArmConfig(_Strict):
    """One arm's telemetry source (`[telemetry.arms.<arm>]`): `metrics_url` or
    `prometheus_url`, never both."""

    kind: ArmKind = Field(
        default="vllm",
        description="the shipped table of series: vllm, sglang, gateway (see `gateway`), or "
        "custom (`signals` names every series)",
    )
    gateway: GatewayFlavour | None = Field(
        default=None,
        description="kind = gateway: whose HTTP counters (istio, envoy, ingress-nginx)",
    )
    metrics_url: ReplicaUrls = Field(
        default=(),
        description="direct scrape: the Prometheus text exposition of each replica, one URL "
        "or a list of them; the arm's counts are the replicas' sum",
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="label matchers every series of this arm must satisfy (e.g. "
        '`destination_workload = "llm-speculative"` on a gateway, `model_name` on a '
        "server with several models)",
    )
    signals: SignalMap | None = Field(
        default=None,
        description="kind = custom: the series of each signal; other kinds: replaces "
        "single entries of the shipped table",
    )
    prometheus_url: str | None = Field(
        default=None,
        description="PromQL source: the base URL of a Prometheus-compatible API, a path "
        "base kept (`http://thanos:9090`, `http://gateway/prometheus`; `/api/v1/query` is "
        "appended); no query string or fragment",
    )
    selector: str = Field(
        default="",
        max_length=1000,
        description="PromQL source: label matchers naming this arm's series, put inside "
        'each template\'s braces: `name="v"`, `name=~"re"`, `name!="v"` or `name!~"re"`, '
        'joined by commas (e.g. `namespace="llm",pod=~"spec-.*"`)',
    )
    queries: dict[Signal, str] = Field(
        default_factory=dict,
        description="PromQL source: a query per signal replacing the shipped template, "
        "evaluated at each scrape; counters and histogram buckets as cumulative values "
        "(`sum by (instance)`, never `increase`), `$selector` and `$range` (the scrape "
        "interval) substituted",
    )

    stable: StableSource | None = Field(
        default=None,
        description="speculative arms: the concurrent stable ([telemetry.arms.<arm>.stable]), "
        "the pods still serving the previous revision; `telemetry.acceptance` then judges "
        "the arm against it over the same scrapes, so a shift in the traffic mix cancels",
    )

    @field_validator("prometheus_url")
    @classmethod
    def _prometheus(cls, url: str | None) -> str | None:
        return None if url is None else _api_base_url(url)

    @field_validator("selector")
    @classmethod
    def _label_matcher_list(cls, selector: str) -> str:
        return _selector(selector)

    @field_validator("labels")
    @classmethod
    def _label_matchers(cls, labels: dict[str, str]) -> dict[str, str]:
        return _matchers(labels)

    @field_validator("queries")
    @classmethod
    def _placeholders(cls, queries: dict[Signal, str]) -> dict[Signal, str]:
        for signal, query in queries.items():
            try:
                Template(query).substitute(selector="", range="1s")
            except (KeyError, ValueError) as exc:
                raise ValueError(
                    f"queries.{signal}: only $selector and $range are substituted "
                    f"(write $$ for a literal $): {exc}"
                ) from exc
        return queries

    @model_validator(mode="after")
    def _one_source(self) -> TelemetryArmConfig:
        if bool(self.metrics_url) == (self.prometheus_url is not None):
            raise ValueError(
                "set exactly one source: metrics_url (direct scrape) or prometheus_url (PromQL)"
            )
        if (self.kind == "gateway") != (self.gateway is not None):
            raise ValueError(
                'kind = "gateway" needs gateway = "istio", "envoy" or "ingress-nginx", '
                "and only it takes one"
            )
        if self.kind == "custom" and self.metrics_url and self.signals is None:
            raise ValueError('kind = "custom" needs [signals]: the series of each signal')
        if self.kind == "custom" and self.prometheus_url is not None and not self.queries:
            raise ValueError('kind = "custom" with prometheus_url needs [queries]')
        if self.prometheus_url is not None and (self.signals is not None or self.labels):
            raise ValueError(
                "signals and labels select series of a direct scrape; with prometheus_url "
                "use selector and queries"
            )
        if self.metrics_url and (self.queries or self.selector):
            raise ValueError(
                "selector and queries are PromQL; with metrics_url use labels and signals"
            )
        self._check_stable()
        return self

    def _check_stable(self) -> None:
        stable = self.stable
        if stable is None:
            return
        if self.metrics_url:
            if stable.selector is not None:
                raise ValueError("stable: selector is PromQL; with metrics_url use labels")
            if not stable.metrics_url and stable.labels is None:
                raise ValueError(
                    "stable: name the stable's series: metrics_url (its replicas) or labels"
                )
            shared = set(stable.metrics_url) & set(self.metrics_url)
            if (not stable.metrics_url or shared) and stable.labels in (None, self.labels):
                raise ValueError(
                    "stable: a URL of the arm's own replicas, with the same labels: "
                    "the arm would be compared with itself"
                )
        else:
            if stable.metrics_url or stable.labels is not None:
                raise ValueError(
                    "stable: metrics_url and labels are a direct scrape's; with "
                    "prometheus_url name the stable's series with selector"
                )
            if stable.selector is None or stable.selector == self.selector:
                raise ValueError(
                    "stable: give the stable's own selector (it differs from the arm's)"
                )

    def stable_config(self) -> TelemetryArmConfig | None:
        """The stable's source: this arm's settings with the stable's series named."""
        stable = self.stable
        if stable is None:
            return None
        update: dict[str, Any] = {"stable": None}
        if stable.metrics_url:
            update["metrics_url"] = stable.metrics_url
        if stable.labels is not None:
            update["labels"] = stable.labels
        if stable.selector is not None:
            update["selector"] = stable.selector
        return self.model_copy(update=update)

    @property
    def direct(self) -> bool:
        """True for a direct scrape, False for PromQL."""
        return bool(self.metrics_url)


class TelemetryConfig(_Strict):
    """Production telemetry of the arms (`[telemetry]`): how often and how much to scrape,
    and each arm's source. No arms: no telemetry."""

    scrape_interval_s: float = Field(
        default=15.0, ge=1.0, description="seconds between two scrapes of every arm"
    )
    timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="a replica's whole answer, connection and parsing included (PromQL: all "
        "of an arm's queries); a read still going then is refused",
    )
    max_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=64 * 1024,
        le=256 * 1024 * 1024,
        description="a replica's exposition (PromQL: all of an arm's answers together) larger "
        "than this once decompressed is refused, the decompression stopped there",
    )
    max_series: int = Field(
        default=DEFAULT_MAX_SERIES,
        ge=16,
        le=65536,
        description="a replica (PromQL: an arm) with more series matching one signal is "
        "refused; a histogram's series counts once, whatever its buckets",
    )
    max_buckets: int = Field(
        default=DEFAULT_MAX_BUCKETS,
        ge=2,
        le=256,
        description="a histogram with more distinct `le` bounds is refused: one replica's "
        "(any of its series), or the arm's replicas summed over an interval",
    )
    retention_days: float = Field(
        default=7.0,
        gt=0,
        description="stored scrape intervals older than this are deleted by the retention "
        "job (two rows per scrape interval: 80,640 a week at 15 s)",
    )
    arms: dict[str, TelemetryArmConfig] = Field(
        default_factory=dict,
        description="one source per arm, named as in [arms] (`baseline` and the speculative arms)",
    )

    @model_validator(mode="after")
    def _timeout_within_interval(self) -> TelemetryConfig:
        if self.timeout_s > self.scrape_interval_s:
            raise ValueError(
                f"timeout_s ({self.timeout_s:g}) exceeds scrape_interval_s "
                f"({self.scrape_interval_s:g}): a slow replica would delay the next scrape"
            )
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.arms)

    def sources(self) -> dict[str, TelemetryArmConfig]:
        """Every source to scrape, by name: each arm's, and each concurrent stable's
        (`stable_source(arm)`) after it."""
        sources: dict[str, TelemetryArmConfig] = {}
        for arm, config in self.arms.items():
            sources[arm] = config
            if (stable := config.stable_config()) is not None:
                sources[stable_source(arm)] = stable
        return sources
