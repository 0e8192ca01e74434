"""The live-traffic series: what the mirror sink receives and what the traffic looks like.

`TrafficMetrics` owns the mirrored requests by outcome (sampled or why not), the queue of
sampled requests waiting for a pair, and the traffic mix of the last closed minute:
each category's share (under the composition's bounded `category` label), the mean
prompt length and the share of repeated word 3-grams. The share and the length were
named without their units before (`canaryd_traffic_category_share`,
`canaryd_traffic_prompt_chars`); those names are exported too, deprecated, for one
release.
"""

from __future__ import annotations

from collections.abc import Mapping

from canaryd.metrics.declare import Declarer
from canaryd.metrics.labels import BoundedLabel


class TrafficMetrics:
    """Mirror-sink and traffic-mix series; `category` bounds categories."""

    def __init__(self, declare: Declarer, *, category: BoundedLabel) -> None:
        self._category = category
        self.requests = declare.counter(
            "canaryd_traffic_requests_total",
            "Requests the mirror sink received, by outcome: sampled (queued for a live "
            "pair), rate_limited, duplicate, too_long, categories, queue_full, "
            "unauthorized, too_large, too_slow, unusable, unlisted, not_found, busy.",
            ("outcome",),
            'sum by (outcome) (rate(canaryd_traffic_requests_total{outcome!="sampled"}[5m]))',
        )
        self.queue = declare.gauge(
            "canaryd_traffic_queue_depth",
            "Sampled live requests waiting for a pair.",
            (),
            "canaryd_traffic_queue_depth",
        )
        self.category_ratio = declare.gauge(
            "canaryd_traffic_category_ratio",
            "Share (0 to 1) of the mirrored requests of the last closed minute in each "
            "category (the traffic mix; categories beyond the label cap are summed under "
            "other).",
            ("category",),
            "canaryd_traffic_category_ratio",
        )
        self.prompt_length = declare.gauge(
            "canaryd_traffic_prompt_length_characters",
            "Mean prompt length, in characters, of the live requests sampled in the last "
            "minute that sampled any.",
            (),
            "canaryd_traffic_prompt_length_characters",
        )
        # The names before the unit suffixes, exported alongside for one release.
        self.category_share = declare.gauge(
            "canaryd_traffic_category_share",
            "Deprecated (removed in the next release): canaryd_traffic_category_ratio.",
            ("category",),
            "canaryd_traffic_category_ratio",
        )
        self.prompt_chars = declare.gauge(
            "canaryd_traffic_prompt_chars",
            "Deprecated (removed in the next release): canaryd_traffic_prompt_length_characters.",
            (),
            "canaryd_traffic_prompt_length_characters",
        )
        self.repetition = declare.gauge(
            "canaryd_traffic_ngram_repetition",
            "Mean share of repeated word 3-grams in the prompts of the live requests "
            "sampled in the last minute that sampled any (the reuse prompt lookup feeds "
            "on).",
            (),
            "canaryd_traffic_ngram_repetition",
        )

    def request(self, outcome: str, n: int = 1) -> None:
        """`n` mirrored requests ended as `outcome` (canaryd.traffic.reservoir.OUTCOMES)."""
        self.requests.labels(outcome=outcome).inc(n)

    def mix(
        self, shares: Mapping[str, float], prompt_chars: float | None, repetition: float | None
    ) -> None:
        """The traffic mix of the last closed minute (the figures None when it sampled
        nothing keep their previous value)."""
        folded: dict[str, float] = {}
        for category, share in shares.items():
            label = self._category(category)
            folded[label] = folded.get(label, 0.0) + share
        for gauge in (self.category_ratio, self.category_share):
            gauge.clear()
            for label, share in folded.items():
                gauge.labels(category=label).set(share)
        if prompt_chars is not None:
            self.prompt_length.set(prompt_chars)
            self.prompt_chars.set(prompt_chars)
        if repetition is not None:
            self.repetition.set(repetition)
