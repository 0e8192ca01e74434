"""Declaring a series once, with its documentation: the `Declarer` every metric family uses.

A `Declarer` holds the `CollectorRegistry` all of `CanarydMetrics`' families register in
and the list of `MetricDoc` rows `metrics_reference()` renders. Each family declares its
series through it, in the order the reference lists them, so the registry and the docs
are built from the same call and cannot drift.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from canaryd.metrics.labels import MetricDoc, MetricType


class Declarer:
    """Registers series in `registry` and appends each one's row to `reference`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.reference: list[MetricDoc] = []

    def _doc(
        self, name: str, kind: MetricType, labels: Sequence[str], meaning: str, example: str
    ) -> None:
        self.reference.append(MetricDoc(name, kind, tuple(labels), meaning, example))

    def counter(self, name: str, doc: str, labels: Sequence[str], example: str) -> Counter:
        self._doc(name, "counter", labels, doc, example)
        return Counter(name, doc, labels, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str], example: str) -> Gauge:
        self._doc(name, "gauge", labels, doc, example)
        return Gauge(name, doc, labels, registry=self.registry)

    def histogram(
        self,
        name: str,
        doc: str,
        labels: Sequence[str],
        example: str,
        buckets: Sequence[float],
    ) -> Histogram:
        self._doc(name, "histogram", labels, doc, example)
        return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

    def info(self, name: str, doc: str, labels: Sequence[str], example: str) -> Info:
        """An info series `name` (exposed as `name_info`); `labels` as documented, since
        an info's labels are set with its value, not declared."""
        info = Info(name, doc, registry=self.registry)
        self._doc(f"{name}_info", "info", labels, doc, example)
        return info
