"""`CanarydMetrics`: every canaryd metric family, composed on one registry of its own.

The composition owns the `CollectorRegistry` (never the process-global default, so two
instances — two tests — never share series), the bounded `category` and `arm` labels the
families share, and the arms configured now. Each family declares and moves its own
series: `pairs`, `liveness`, `store`, `switch`, `probe`, `traffic`, `build` and
`telemetry`, in that order, which is the order of the registry and of
`metrics_reference()`, the table docs/metrics.md carries verbatim. The flat methods
(`observe_pair`, `store_error`, …) delegate to the families, for callers that hold the
whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from canaryd.metrics.build import BuildMetrics
from canaryd.metrics.declare import Declarer
from canaryd.metrics.labels import LABEL_VALUE, BoundedLabel, MetricDoc
from canaryd.metrics.liveness import LivenessMetrics
from canaryd.metrics.pairs import PairMetrics
from canaryd.metrics.probe import ProbeMetrics
from canaryd.metrics.store import StoreMetrics
from canaryd.metrics.switch import SwitchMetrics
from canaryd.metrics.telemetry import TelemetryMetrics
from canaryd.metrics.traffic import TrafficMetrics
from gates.records import ARMS, PairRecord


class CanarydMetrics:
    """Every canaryd metric, in one registry of its own.

    `categories` are the suites' categories (pre-created so their pair counters read 0,
    not "absent"); categories seen later are admitted up to `max_categories` in all, the
    rest counted under `other`. All methods are thread-safe.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        categories: Iterable[str] = (),
        max_categories: int = 64,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        declare = Declarer(self.registry)
        self.reference: list[MetricDoc] = declare.reference
        known = sorted({c for c in categories if LABEL_VALUE.match(c)})
        self._category = BoundedLabel(max_categories, known)
        # Arm names are validated by the configuration; the bound guards other callers.
        self._arm = BoundedLabel(16, ARMS)

        self.pairs = PairMetrics(
            declare, category=self._category, arm=self._arm, known_categories=known
        )
        self.liveness = LivenessMetrics(declare, arm=self._arm)
        self.store = StoreMetrics(declare)
        self.switch = SwitchMetrics(declare, category=self._category)
        self.probe = ProbeMetrics(declare, arm=self._arm)
        self.traffic = TrafficMetrics(declare, category=self._category)
        self.build = BuildMetrics(declare)
        self.telemetry = TelemetryMetrics(declare, arm=self._arm)

        self._arm_series: set[str] = set()
        self.set_arms(ARMS)

    # -- series the daemon sets directly --

    @property
    def tie_margin_nats(self) -> float:
        """The quality gate's tie margin, for the divergence counter (the daemon sets it)."""
        return self.pairs.tie_margin_nats

    @tie_margin_nats.setter
    def tie_margin_nats(self, margin: float) -> None:
        self.pairs.tie_margin_nats = margin

    @property
    def pair_interval(self) -> Gauge:
        """`canaryd_pair_interval_seconds`."""
        return self.liveness.pair_interval

    @property
    def traffic_queue(self) -> Gauge:
        """`canaryd_traffic_queue_depth`."""
        return self.traffic.queue

    # -- what the daemon reports --

    def category_label(self, category: str) -> str:
        """The `category` label a prompt category is counted under."""
        return self._category(category)

    def set_arms(self, names: Iterable[str]) -> None:
        """The arms configured now (baseline included): their engine-ready and error
        series exist (reading 0), those of arms no longer configured are removed, so
        `min(canaryd_engine_ready)` never waits on an arm that is gone."""
        wanted = [self._arm(name) for name in names]
        for arm in list(self._arm_series):
            if arm not in wanted:
                self.liveness.remove_arm(arm)
                self.pairs.remove_arm(arm)
                self._arm_series.discard(arm)
        for arm in wanted:
            if arm not in self._arm_series:
                self.pairs.add_arm(arm)
                self.liveness.add_arm(arm)
                self._arm_series.add(arm)

    def observe_pair(self, record: PairRecord) -> None:
        """Count one finished pair (`PairMetrics.observe_pair`)."""
        self.pairs.observe_pair(record)

    def observe_group(self, records: Sequence[PairRecord]) -> None:
        """Count one prompt sent to several speculative arms (`PairMetrics.observe_group`)."""
        self.pairs.observe_group(records)

    def cycle_finished(self, timestamp: float, ok: bool) -> None:
        """A pair cycle ended at `timestamp` (Unix seconds)."""
        self.liveness.cycle_finished(timestamp, ok)

    def gate_run_finished(self, timestamp: float, ok: bool) -> None:
        """A gate run ended at `timestamp` (Unix seconds), completed (`ok`) or raised."""
        self.liveness.gate_run_finished(timestamp, ok)

    def heartbeat(self, timestamp: float) -> None:
        """The daemon's heartbeat at `timestamp` (Unix seconds)."""
        self.liveness.heartbeat(timestamp)

    def set_engine_ready(self, arm: str, ready: bool) -> None:
        """Whether `arm`'s engine is loaded and answering."""
        self.liveness.set_engine_ready(arm, ready)

    def store_error(self, kind: str) -> None:
        """A store operation failed; `kind` is a short lower-case identifier."""
        self.store.error(kind)

    def pair_quarantined(self) -> None:
        """A pair went to the quarantine file instead of the database."""
        self.store.pair_quarantined()

    def pair_sanitised(self) -> None:
        """A pair was stored with its text made storable."""
        self.store.pair_sanitised()

    def pending_pairs(self, n: int) -> None:
        """`n` pairs are buffered in memory, waiting for the database."""
        self.store.pending_pairs(n)

    def observe_gates(self, decisions: Iterable[tuple[str, str]]) -> None:
        """One evaluation's `(gate name, state)` pairs (`SwitchMetrics.observe_gates`)."""
        self.switch.observe_gates(decisions)

    def observe_detectors(self, readings: Iterable[tuple[str, float]]) -> None:
        """One evaluation's `(check name, detector progress)` pairs."""
        self.switch.observe_detectors(readings)

    def set_pair_rate_ratio(self, ratio: float) -> None:
        """The measured pair rate over the budget's design rate (`canaryd_pair_rate_ratio`)."""
        self.switch.pair_rate_ratio.set(ratio)

    def set_switch(
        self,
        *,
        rolled_back: bool,
        generation: int,
        latched: bool,
        categories: Iterable[tuple[str, bool, bool]] = (),
    ) -> None:
        """The switch as stored now (`SwitchMetrics.set_state`)."""
        self.switch.set_state(
            rolled_back=rolled_back, generation=generation, latched=latched, categories=categories
        )

    def set_leader(self, leading: bool) -> None:
        """Whether this daemon leads the gates and the switch now."""
        self.switch.set_leader(leading)

    def switch_transition(self, target: str, actor_kind: str) -> None:
        """A transition to `target` (auto, rolled_back) by a `gate` or a `user`."""
        self.switch.transition(target, actor_kind)

    def actuator_failed(self, actuator: str) -> None:
        """One failed attempt of `actuator` (state_file, command, webhook, alertmanager)."""
        self.switch.actuator_failed(actuator)

    def probe_finished(
        self,
        timestamp: float,
        states: Iterable[tuple[str, str, str]],
        regressions: Iterable[str],
    ) -> None:
        """A capability probe ended at `timestamp` (`ProbeMetrics.finished`)."""
        self.probe.finished(timestamp, states, regressions)

    def probe_failed(self) -> None:
        """A capability probe could not run (an arm away, a baseline failing)."""
        self.probe.failed()

    def traffic_request(self, outcome: str, n: int = 1) -> None:
        """`n` mirrored requests ended as `outcome` (canaryd.traffic.reservoir.OUTCOMES)."""
        self.traffic.request(outcome, n)

    def traffic_mix(
        self, shares: Mapping[str, float], prompt_chars: float | None, repetition: float | None
    ) -> None:
        """The traffic mix of the last closed minute (`TrafficMetrics.mix`)."""
        self.traffic.mix(shares, prompt_chars, repetition)

    def set_build_info(
        self,
        version: str,
        python: str,
        torch: str,
        transformers: str,
        baseline: dict[str, str],
        speculative: dict[str, str],
    ) -> None:
        """Replace the build info (`BuildMetrics.set`)."""
        self.build.set(version, python, torch, transformers, baseline, speculative)

    def render(self) -> bytes:
        """The registry in the Prometheus text exposition format (0.0.4)."""
        return generate_latest(self.registry)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def metrics_reference() -> str:
    """The Markdown reference table of every metric, from the declarations themselves."""
    rows = [
        "| metric | type | labels | meaning | PromQL example |",
        "|---|---|---|---|---|",
    ]
    for doc in CanarydMetrics().reference:
        labels = ", ".join(f"`{label}`" for label in doc.labels) or "—"
        rows.append(
            f"| `{doc.name}` | {doc.type} | {labels} | {_cell(doc.meaning)} "
            f"| `{_cell(doc.example)}` |"
        )
    return "\n".join(rows) + "\n"
