"""Production telemetry of the arms: what the serving engines and gateways count at real
load, read per arm and turned into per-interval evidence for the telemetry gates.

`config` holds the `[telemetry]` models; `signals` the shipped tables of which series give
which signal (vLLM, SGLang, Istio, Envoy, ingress-nginx) and the reader that applies one;
`scrape` the direct scrape of Prometheus text expositions (httpx, prometheus-client's
parser); `deltas` the pure arithmetic between two readings (resets, replicas, histogram
quantiles) into a `TelemetryWindow`; `promql` the same signals as PromQL templates and
`promql_source` the source that asks them of a Prometheus-compatible API; `sources` the
`TelemetrySource` protocol and the factory that opens an arm's source.
The names below are imported on first use (PEP 562), each from the module its
TYPE_CHECKING import names (`engine.lazy`): the settings need only `config`, so a command
that reads them (the kill switch) imports neither httpx nor the parsers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.lazy import lazy_exports

if TYPE_CHECKING:
    from canaryd.telemetry.config import (
        SeriesSpec,
        SignalMap,
        TelemetryArmConfig,
        TelemetryConfig,
    )
    from canaryd.telemetry.deltas import (
        BucketCounts,
        TelemetryWindow,
        histogram_quantile,
        telemetry_window,
    )
    from canaryd.telemetry.promql_source import PromqlSource
    from canaryd.telemetry.scrape import ScrapeSource, parse_exposition
    from canaryd.telemetry.signals import ArmReading, ReplicaReading, SignalReader, signal_map
    from canaryd.telemetry.sources import TelemetrySource, open_source

__getattr__, __dir__ = lazy_exports(globals())


__all__ = [
    "ArmReading",
    "BucketCounts",
    "PromqlSource",
    "ReplicaReading",
    "ScrapeSource",
    "SeriesSpec",
    "SignalMap",
    "SignalReader",
    "TelemetryArmConfig",
    "TelemetryConfig",
    "TelemetrySource",
    "TelemetryWindow",
    "histogram_quantile",
    "open_source",
    "parse_exposition",
    "signal_map",
    "telemetry_window",
]
