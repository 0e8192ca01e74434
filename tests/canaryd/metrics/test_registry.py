"""canaryd.metrics.registry: `CanarydMetrics` composes the metric families on one registry,
shares the bounded labels between them, and offers nothing of a family's own: a consumer
moves a series through the family that declares it."""

from __future__ import annotations

from itertools import pairwise

from prometheus_client import CollectorRegistry

from canaryd.metrics import CanarydMetrics
from canaryd.metrics.declare import Declarer
from canaryd.metrics.labels import BoundedLabel
from canaryd.metrics.store import StoreMetrics
from canaryd.metrics.switch import SwitchMetrics
from engine.types import ErrorKind


def value(metrics: CanarydMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def label_values(metrics: CanarydMetrics, family: str, label: str) -> set[str]:
    return {
        sample.labels[label]
        for metric in metrics.registry.collect()
        if metric.name == family
        for sample in metric.samples
        if label in sample.labels
    }


class TestComposition:
    def test_families_declare_in_reference_order(self) -> None:
        """Each family's series are one contiguous run of the reference, in the order
        pairs, liveness, store, switch, probe, traffic, build, telemetry."""
        names = [doc.name for doc in CanarydMetrics().reference]
        runs = [
            ("canaryd_pairs_total", "canaryd_task_score_delta"),
            ("canaryd_cycles_total", "canaryd_engine_ready"),
            ("canaryd_store_errors_total", "canaryd_store_pending_pairs"),
            ("canaryd_gate_state", "canaryd_actuator_failures_total"),
            ("canaryd_probe_capability_state", "canaryd_last_probe_timestamp_seconds"),
            ("canaryd_traffic_requests_total", "canaryd_traffic_ngram_repetition"),
            ("canaryd_build_info", "canaryd_build_info"),
            ("canaryd_telemetry_scrapes_total", "canaryd_telemetry_last_scrape_timestamp_seconds"),
        ]
        bounds = [(names.index(first), names.index(last)) for first, last in runs]
        assert bounds[0][0] == 0 and bounds[-1][1] == len(names) - 1
        for (_, end), (start, _) in pairwise(bounds):
            assert start == end + 1

    def test_a_family_declares_on_the_registry_it_is_given(self) -> None:
        """A family alone registers its series and reference rows through its Declarer."""
        declare = Declarer(CollectorRegistry())
        store = StoreMetrics(declare)
        store.error("connection")
        store.pending_pairs(2)
        registry = declare.registry
        assert registry.get_sample_value("canaryd_store_errors_total", {"kind": "connection"}) == 1
        assert registry.get_sample_value("canaryd_store_pending_pairs") == 2
        assert [d.name for d in declare.reference] == [
            "canaryd_store_errors_total",
            "canaryd_pairs_quarantined_total",
            "canaryd_pairs_sanitised_total",
            "canaryd_store_pending_pairs",
        ]

    def test_every_family_moves_series_of_the_one_registry(self) -> None:
        """What a consumer moves through its family (a counter, the daemon's gauges) is
        served by the composition's registry."""
        metrics = CanarydMetrics()
        metrics.store.error("connection")
        metrics.switch.transition("rolled_back", "gate")
        metrics.traffic.request("sampled", 2)
        metrics.liveness.heartbeat(2.0)
        metrics.liveness.pair_interval.set(30)
        metrics.traffic.queue.set(4)
        assert value(metrics, "canaryd_store_errors_total", kind="connection") == 1
        assert (
            value(
                metrics,
                "canaryd_switch_transitions_total",
                target="rolled_back",
                actor_kind="gate",
            )
            == 1
        )
        assert value(metrics, "canaryd_traffic_requests_total", outcome="sampled") == 2
        assert value(metrics, "canaryd_heartbeat_timestamp_seconds") == 2.0
        assert value(metrics, "canaryd_pair_interval_seconds") == 30
        assert value(metrics, "canaryd_traffic_queue_depth") == 4

    def test_offers_only_what_spans_families(self) -> None:
        """Besides the families and the registry, the composition has only the shared
        category label, the arms configured now and the rendering: no family's method."""
        metrics = CanarydMetrics()
        families = {"pairs", "liveness", "store", "switch", "probe", "traffic", "build"}
        families.add("telemetry")
        public = {name for name in vars(metrics) if not name.startswith("_")}
        assert public == families | {"registry", "reference"}
        methods = {name for name in vars(CanarydMetrics) if not name.startswith("_")}
        assert methods == {"category_label", "set_arms", "render"}


class TestSharedLabels:
    def test_families_share_one_category_bound(self) -> None:
        """A category admitted by pairs counts toward the cap the switch and the traffic
        mix see: past it, their categories fold into `other`."""
        metrics = CanarydMetrics(categories=["qa"], max_categories=2)
        assert metrics.category_label("code") == "code"  # the cap is reached
        metrics.traffic.mix({"math": 1.0}, None, None)
        metrics.switch.set_state(
            rolled_back=False, generation=1, latched=False, categories=[("rag", True, False)]
        )
        assert label_values(metrics, "canaryd_traffic_category_share", "category") == {"other"}
        assert label_values(metrics, "canaryd_switch_category_rolled_back", "category") == {"other"}

    def test_a_family_uses_the_bound_it_is_given(self) -> None:
        """A family built alone folds categories by the bound passed to it."""
        declare = Declarer(CollectorRegistry())
        switch = SwitchMetrics(declare, category=BoundedLabel(1, ["qa"]))
        switch.set_state(
            rolled_back=True, generation=2, latched=False, categories=[("code", True, True)]
        )
        assert (
            declare.registry.get_sample_value(
                "canaryd_switch_category_latched", {"category": "other"}
            )
            == 1
        )


class TestArms:
    def test_set_arms_replaces_readiness_and_error_series(self) -> None:
        """Arms no longer configured lose their engine-ready and error series; new arms
        get both, reading 0."""
        metrics = CanarydMetrics()
        metrics.liveness.set_engine_ready("speculative", True)
        metrics.set_arms(["baseline", "eagle"])
        assert label_values(metrics, "canaryd_engine_ready", "arm") == {"baseline", "eagle"}
        assert label_values(metrics, "canaryd_errors", "arm") == {"baseline", "eagle"}
        assert value(metrics, "canaryd_engine_ready", arm="eagle") == 0
        kinds = {kind.value for kind in ErrorKind if kind is not ErrorKind.NONE}
        assert label_values(metrics, "canaryd_errors", "kind") == kinds
        assert value(metrics, "canaryd_errors_total", arm="eagle", kind="oom") == 0
