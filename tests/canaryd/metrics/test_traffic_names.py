"""The traffic-mix series under their unit-suffixed names, and the names they had before
(deprecated, exported for one release): both carry the same figures, and the old ones
say in their HELP what replaces them."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from canaryd.metrics import CanarydMetrics

RENAMED = {
    "canaryd_traffic_category_share": "canaryd_traffic_category_ratio",
    "canaryd_traffic_prompt_chars": "canaryd_traffic_prompt_length_characters",
}


def samples(metrics: CanarydMetrics) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    values: dict[str, dict[str, float]] = {}
    helps: dict[str, str] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        helps[family.name] = family.documentation
        for sample in family.samples:
            key = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values.setdefault(sample.name, {})[key] = sample.value
    return values, helps


def test_old_and_new_names_carry_the_same_figures() -> None:
    metrics = CanarydMetrics(categories=["code", "chat"])
    metrics.traffic.mix({"code": 0.75, "chat": 0.25}, 812.5, 0.1)
    values, helps = samples(metrics)
    assert values["canaryd_traffic_category_ratio"] == {
        "category=chat": 0.25,
        "category=code": 0.75,
    }
    assert values["canaryd_traffic_prompt_length_characters"] == {"": 812.5}
    for old, new in RENAMED.items():
        assert values[old] == values[new], old
        assert helps[old].startswith("Deprecated") and new in helps[old], old
        assert not helps[new].startswith("Deprecated"), new
    # A minute with other categories replaces the mix under both names.
    metrics.traffic.mix({"chat": 1.0}, None, None)
    values, _ = samples(metrics)
    for old, new in RENAMED.items():
        assert values.get(old) == values.get(new), old
    assert values["canaryd_traffic_category_ratio"] == {"category=chat": 1.0}
