"""The telemetry-source seam: one protocol every source satisfies, and the one factory
that picks a source for an arm's configuration.

A source reads one arm at one instant into an `ArmReading`; what the servers did is in
the reading (answers or failures), so `read` never raises for it. Two sources: the
direct scrape of each replica's exposition (`scrape.ScrapeSource`, `metrics_url`) and
PromQL instant queries against a Prometheus-compatible API
(`promql_source.PromqlSource`, `prometheus_url`); both give the same readings.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from canaryd.errors import ConfigError
from canaryd.telemetry.config import TelemetryConfig, source_arm
from canaryd.telemetry.promql_source import PromqlSource
from canaryd.telemetry.scrape import ScrapeSource
from canaryd.telemetry.signals import ArmReading


class TelemetrySource(Protocol):
    """One arm's production telemetry."""

    arm: str

    def read(self, now: datetime) -> ArmReading:
        """Every replica's reading (or failure) at `now`; never raises for a server."""
        ...

    def close(self) -> None: ...


def open_source(arm: str, config: TelemetryConfig, source: str = "[telemetry]") -> TelemetrySource:
    """The source of `arm`'s telemetry as `config` sets it (`arm` may name a concurrent
    stable, `config.stable_source`); `ConfigError` naming the key (in `source`, the
    configuration's file) when the arm has none."""
    key = f"telemetry.arms.{source_arm(arm)}" + (".stable" if arm != source_arm(arm) else "")
    arm_config = config.sources().get(arm)
    if arm_config is None:
        raise ConfigError(source, key, "no telemetry source for this arm")
    if not arm_config.direct:
        return PromqlSource(
            arm,
            arm_config,
            timeout_s=config.timeout_s,
            max_bytes=config.max_bytes,
            max_series=config.max_series,
            max_buckets=config.max_buckets,
            range_s=config.scrape_interval_s,
        )
    return ScrapeSource(
        arm,
        arm_config,
        timeout_s=config.timeout_s,
        max_bytes=config.max_bytes,
        max_series=config.max_series,
        max_buckets=config.max_buckets,
    )
