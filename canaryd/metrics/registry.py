"""`CanarydMetrics`: every canaryd metric family, composed on one registry of its own.

The composition owns the `CollectorRegistry` (never the process-global default, so two
instances — two tests — never share series), the bounded `category` and `arm` labels the
families share, and the arms configured now. Each family declares and moves its own
series: `pairs`, `liveness`, `store`, `switch`, `probe`, `traffic`, `build` and
`telemetry`, in that order, which is the order of the registry and of
`metrics_reference()`, the table docs/metrics.md carries verbatim. A consumer holds the
family it moves (`SwitchMetrics` for the switch, `StoreMetrics` for the pair writer, …),
as prometheus_client's collectors are held; only what spans families is here: the arms
configured now, the shared labels and the rendering of the whole registry.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, generate_latest

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
from gates.records import ARMS


class CanarydMetrics:
    """Every canaryd metric, in one registry of its own.

    `categories` are the suites' categories (pre-created so their pair counters read 0,
    not "absent"); categories seen later are admitted up to `max_categories` in all, the
    rest counted under `other`. Each family is an attribute; all their methods are
    thread-safe.
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
