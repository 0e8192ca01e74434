"""The `[telemetry]` models (canaryd.telemetry.config), the shipped tables of series
(canaryd.telemetry.signals) and the PromQL templates (canaryd.telemetry.promql): one
source per arm, replicas as a list, a gateway named, a custom table required, bad
matchers and names refused with the key; the tables name the series the servers export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from canaryd.config import Settings, load_settings
from canaryd.errors import ConfigError
from canaryd.telemetry.config import HISTOGRAM_SIGNALS as HISTOGRAMS
from canaryd.telemetry.config import TelemetryArmConfig, TelemetryConfig
from canaryd.telemetry.promql import promql_reference, render, templates
from canaryd.telemetry.promql_source import PromqlSource
from canaryd.telemetry.scrape import ScrapeSource
from canaryd.telemetry.signals import GATEWAYS, SGLANG, VLLM, sample_names, signal_map
from canaryd.telemetry.sources import open_source

URL = "http://10.0.0.1:8000/metrics"


def arm(**fields: Any) -> TelemetryArmConfig:
    return TelemetryArmConfig.model_validate(fields)


class TestArmConfig:
    def test_metrics_url_takes_one_url_or_a_list(self) -> None:
        """One string is one replica; a list is one per replica."""
        assert arm(metrics_url=URL).metrics_url == (URL,)
        two = arm(metrics_url=[URL, "http://10.0.0.2:8000/metrics"])
        assert len(two.metrics_url) == 2 and two.direct

    @pytest.mark.parametrize(
        ("fields", "message"),
        [
            ({}, "exactly one source"),
            ({"metrics_url": URL, "prometheus_url": "http://prom:9090"}, "exactly one source"),
            ({"metrics_url": "ftp://x/metrics"}, "not an http:// or https:// URL"),
            ({"metrics_url": [URL, URL]}, "listed twice"),
            ({"metrics_url": URL, "kind": "gateway"}, "needs gateway"),
            ({"metrics_url": URL, "gateway": "istio"}, "only it takes one"),
            ({"metrics_url": URL, "kind": "custom"}, "needs [signals]"),
            ({"metrics_url": URL, "labels": {"model": "("}}, "not a regular expression"),
            ({"metrics_url": URL, "labels": {"1bad": "x"}}, "not a Prometheus label name"),
            ({"metrics_url": URL, "signals": {"errors": {"series": "a b"}}}, "metric name"),
            ({"metrics_url": URL, "selector": 'pod="x"'}, "selector and queries are PromQL"),
            ({"prometheus_url": "http://prom:9090", "labels": {"a": "b"}}, "use selector"),
            (
                {"prometheus_url": "http://prom:9090", "queries": {"errors": "x{$pod}"}},
                "queries.errors: only",
            ),
            ({"metrics_url": URL, "unknown": 1}, "Extra inputs are not permitted"),
        ],
    )
    def test_a_bad_arm_is_refused_with_its_reason(
        self, fields: dict[str, Any], message: str
    ) -> None:
        with pytest.raises(ValidationError, match=message.replace("[", r"\[")):
            arm(**fields)

    def test_the_section_bounds_its_figures(self) -> None:
        """Defaults scrape every 15 s within 5 s and 8 MiB; no arms is no telemetry."""
        config = TelemetryConfig()
        assert (config.scrape_interval_s, config.timeout_s, config.max_bytes) == (
            15.0,
            5.0,
            8 * 1024 * 1024,
        )
        assert not config.enabled
        with pytest.raises(ValidationError, match="max_bytes"):
            TelemetryConfig(max_bytes=10)
        section = TelemetryConfig.model_validate(
            {"arms": {"baseline": {"metrics_url": URL}, "speculative": {"metrics_url": URL}}}
        )
        assert section.enabled and set(section.arms) == {"baseline", "speculative"}


class TestTables:
    def test_vllm_names_its_real_series(self) -> None:
        """Finish reasons (errors: `error`), the three latency histograms, the scheduler
        gauges and the three speculative decoding counters."""
        assert VLLM.requests is not None and VLLM.requests.series == "vllm:request_success_total"
        assert VLLM.errors is not None and VLLM.errors.labels == {"finished_reason": "error"}
        assert VLLM.itl is not None and VLLM.itl.series == "vllm:inter_token_latency_seconds"
        assert VLLM.accepted_tokens is not None
        assert VLLM.accepted_tokens.series == "vllm:spec_decode_num_accepted_tokens_total"

    def test_sglang_has_no_error_counter_and_acceptance_gauges(self) -> None:
        assert SGLANG.errors is None and SGLANG.drafts is None
        assert SGLANG.acceptance_length is not None
        assert SGLANG.acceptance_length.series == "sglang:spec_accept_length"

    def test_gateways_count_5xx_and_scale_milliseconds(self) -> None:
        """Istio counts the destination's report only; millisecond histograms scale."""
        istio = GATEWAYS["istio"]
        assert istio.errors is not None
        assert istio.errors.labels == {"reporter": "destination", "response_code": "5.."}
        assert istio.e2e is not None and istio.e2e.scale == 0.001
        assert GATEWAYS["ingress-nginx"].e2e is not None
        assert GATEWAYS["ingress-nginx"].e2e.scale == 1.0

    def test_signals_replace_single_entries_of_the_shipped_table(self) -> None:
        """An older vLLM's ITL histogram replaces the shipped one; the rest stays."""
        config = arm(
            metrics_url=URL, signals={"itl": {"series": "vllm:time_per_output_token_seconds"}}
        )
        table = signal_map(config)
        assert table.itl is not None and table.itl.series == "vllm:time_per_output_token_seconds"
        assert table.e2e == VLLM.e2e
        custom = arm(metrics_url=URL, kind="custom", signals={"requests": {"series": "x_total"}})
        assert signal_map(custom).errors is None

    def test_sample_names(self) -> None:
        """Counters are found with and without `_total`, histograms by their buckets."""
        assert sample_names("requests", "a_total") == ("a", "a_total")
        assert sample_names("e2e", "lat_seconds") == ("lat_seconds_bucket",)
        assert sample_names("running", "run") == ("run",)


class TestPromql:
    def test_templates_are_rendered_with_selector_and_range(self) -> None:
        """Counters are cumulative sums per serving process, histograms cumulative bucket
        counters per process and `le`; an empty selector leaves no stray comma."""
        config = arm(prometheus_url="http://prom:9090", selector='namespace="llm"')
        queries = templates(config)
        assert render(queries["errors"], selector='namespace="llm"', range_s=15) == (
            'sum by (instance) (vllm:request_success_total{finished_reason="error",'
            'namespace="llm"})'
        )
        assert render(queries["e2e"], selector="", range_s=14.6) == (
            "sum by (instance, le) (vllm:e2e_request_latency_seconds_bucket{})"
        )
        assert render(queries["errors"], selector="", range_s=15).count(",}") == 0
        sglang = templates(arm(prometheus_url="http://prom:9090", kind="sglang"))
        assert render(sglang["acceptance_length"], selector="", range_s=15) == (
            "avg by (instance) (avg_over_time(sglang:spec_accept_length{}[15s]))"
        )

    def test_queries_replace_templates(self) -> None:
        config = arm(
            prometheus_url="http://prom:9090",
            kind="gateway",
            gateway="envoy",
            queries={"requests": "sum by (instance) (x{$selector})"},
        )
        assert templates(config)["requests"] == "sum by (instance) (x{$selector})"
        assert "envoy_cluster_upstream_rq_xx" in templates(config)["errors"]

    def test_the_templates_name_the_series_of_the_scrape_tables(self) -> None:
        """Each template reads the series the direct scrape's table names for that kind
        and signal (a histogram's `_bucket`s; a counter under its exposed name, which
        Prometheus keeps), so the two sources cannot drift apart."""
        kinds: list[dict[str, Any]] = [
            {"kind": "vllm"},
            {"kind": "sglang"},
            *({"kind": "gateway", "gateway": flavour} for flavour in GATEWAYS),
        ]
        for fields in kinds:
            config = arm(prometheus_url="http://prom:9090", **fields)
            table = signal_map(config)
            queries = templates(config)
            assert set(queries) == {s for s in queries if table.spec(s) is not None}
            for signal, query in queries.items():
                spec = table.spec(signal)
                assert spec is not None
                name = sample_names(signal, spec.series)[0] if signal in HISTOGRAMS else spec.series
                assert f"{name}{{" in query, (fields, signal)
                for name, pattern in spec.labels.items():
                    assert f'{name}="{pattern}"' in query or f'{name}=~"{pattern}"' in query

    def test_the_templates_table_in_the_docs_is_current(self) -> None:
        """docs/telemetry.md carries promql_reference() as it is."""
        docs = Path(__file__).parents[3] / "docs" / "telemetry.md"
        assert promql_reference() in docs.read_text()


class TestStable:
    """`[telemetry.arms.<arm>.stable]`: the concurrent stable's series, every other
    setting the arm's."""

    def test_a_direct_stable_is_its_own_source_with_the_arm_settings(self) -> None:
        config = TelemetryConfig.model_validate(
            {
                "arms": {
                    "baseline": {"metrics_url": URL},
                    "speculative": {
                        "kind": "sglang",
                        "metrics_url": "http://10.0.0.2:8000/metrics",
                        "stable": {"metrics_url": "http://10.0.0.3:8000/metrics"},
                    },
                }
            }
        )
        sources = config.sources()
        assert list(sources) == ["baseline", "speculative", "speculative@stable"]
        stable = sources["speculative@stable"]
        assert stable.kind == "sglang" and stable.stable is None
        assert stable.metrics_url == ("http://10.0.0.3:8000/metrics",)
        source = open_source("speculative@stable", config)
        try:
            assert isinstance(source, ScrapeSource)
        finally:
            source.close()

    def test_a_promql_stable_replaces_the_selector(self) -> None:
        spec = arm(
            prometheus_url="http://prom:9090",
            selector='service="spec-canary"',
            stable={"selector": 'service="spec-stable"'},
        )
        stable = spec.stable_config()
        assert stable is not None and stable.selector == 'service="spec-stable"'
        assert stable.prometheus_url == "http://prom:9090"

    def test_labels_tell_the_stable_apart_on_a_shared_endpoint(self) -> None:
        spec = arm(
            kind="gateway",
            gateway="istio",
            metrics_url=URL,
            labels={"destination_workload": "spec-canary"},
            stable={"labels": {"destination_workload": "spec-stable"}},
        )
        stable = spec.stable_config()
        assert stable is not None and stable.metrics_url == (URL,)
        assert stable.labels == {"destination_workload": "spec-stable"}

    @pytest.mark.parametrize(
        ("fields", "message"),
        [
            ({"metrics_url": URL, "stable": {}}, "name the stable's series"),
            ({"metrics_url": URL, "stable": {"metrics_url": URL}}, "compared with itself"),
            ({"metrics_url": URL, "stable": {"selector": 'a="b"'}}, "selector is PromQL"),
            (
                {"prometheus_url": "http://prom:9090", "stable": {"metrics_url": URL}},
                "with prometheus_url name the stable's series with selector",
            ),
            (
                {"prometheus_url": "http://prom:9090", "selector": 'a="b"', "stable": {}},
                "give the stable's own selector",
            ),
            (
                {"prometheus_url": "http://prom:9090", "stable": {"selector": "a=b"}},
                "not a list of PromQL label matchers",
            ),
        ],
    )
    def test_a_bad_stable_is_refused_with_its_reason(
        self, fields: dict[str, Any], message: str
    ) -> None:
        with pytest.raises(ValidationError, match=re.escape(message)):
            arm(**fields)

    def test_the_baseline_has_no_stable(self, tmp_path: Path) -> None:
        path = tmp_path / "canaryd.toml"
        path.write_text(
            f'[telemetry.arms.baseline]\nmetrics_url = "{URL}"\n'
            '[telemetry.arms.baseline.stable]\nmetrics_url = "http://10.0.0.9:8000/metrics"\n'
        )
        with pytest.raises(ConfigError, match=r"telemetry\.arms\.baseline\.stable"):
            load_settings(path)


class TestOpenSource:
    def test_a_direct_arm_opens_a_scrape_and_a_promql_arm_a_query(self) -> None:
        """The factory scrapes `metrics_url` arms and queries `prometheus_url` ones, with
        the section's timeout and cap; an arm without a source is a ConfigError naming
        the key."""
        config = TelemetryConfig.model_validate(
            {
                "timeout_s": 3,
                "arms": {
                    "baseline": {"metrics_url": URL},
                    "speculative": {"prometheus_url": "http://prom:9090"},
                },
            }
        )
        source = open_source("baseline", config)
        try:
            assert isinstance(source, ScrapeSource) and source.timeout_s == 3
        finally:
            source.close()
        promql = open_source("speculative", config)
        try:
            assert isinstance(promql, PromqlSource) and promql.timeout_s == 3
            assert promql.max_bytes == config.max_bytes
        finally:
            promql.close()
        with pytest.raises(ConfigError, match=r"telemetry\.arms\.other: no telemetry source"):
            open_source("other", config)

    def test_the_timeout_fits_in_the_interval(self) -> None:
        with pytest.raises(ValidationError, match="exceeds scrape_interval_s"):
            TelemetryConfig(scrape_interval_s=5, timeout_s=10)


class TestSettings:
    """`[telemetry]` in canaryd.toml, through `load_settings`."""

    @staticmethod
    def load(tmp_path: Path, text: str) -> Settings:
        path = tmp_path / "canaryd.toml"
        path.write_text(text)
        return load_settings(path)

    def test_no_section_is_no_telemetry(self, tmp_path: Path) -> None:
        """Without `[telemetry]` no arm has a source: telemetry is off."""
        settings = self.load(tmp_path, "[prompts]\nseed = 1\n")
        assert not settings.telemetry.enabled and settings.telemetry.arms == {}

    def test_both_arms_load(self, tmp_path: Path) -> None:
        """Sources for the baseline (two replicas) and the speculative arm load as given."""
        settings = self.load(
            tmp_path,
            "[telemetry]\nscrape_interval_s = 5\n"
            f'[telemetry.arms.baseline]\nmetrics_url = ["{URL}", "http://10.0.0.2:8000/metrics"]\n'
            f'[telemetry.arms.speculative]\nmetrics_url = "{URL}"\n',
        )
        assert settings.telemetry.enabled and settings.telemetry.scrape_interval_s == 5
        assert len(settings.telemetry.arms["baseline"].metrics_url) == 2

    def test_the_promql_example_of_the_docs_loads(self, tmp_path: Path) -> None:
        """docs/telemetry.md's PromQL example is a valid configuration; each arm opens a
        PromQL source whose queries carry the arm's selector."""
        docs = (Path(__file__).parents[3] / "docs" / "telemetry.md").read_text()
        promql = docs.split("## PromQL sources", 1)[1]
        example = promql.split("```toml\n", 1)[1].split("```", 1)[0]
        settings = self.load(tmp_path, example)
        source = open_source("speculative", settings.telemetry)
        try:
            assert isinstance(source, PromqlSource)
            assert source.queries["itl"] == (
                "sum by (instance, le) (vllm:time_per_output_token_seconds_bucket"
                '{namespace="prod",service="llama-canary"})'
            )
            assert 'service="llama-canary"' in source.queries["requests"]
        finally:
            source.close()

    def test_the_stable_example_of_the_docs_loads(self, tmp_path: Path) -> None:
        """docs/telemetry.md's concurrent-stable example (with a baseline) loads, and the
        stable's source is the arm's with the stable's selector."""
        docs = (Path(__file__).parents[3] / "docs" / "telemetry.md").read_text()
        section = docs.split("## The concurrent stable", 1)[1]
        example = section.split("```toml\n", 1)[1].split("```", 1)[0]
        settings = self.load(
            tmp_path, f'[telemetry.arms.baseline]\nmetrics_url = "{URL}"\n' + example
        )
        stable = settings.telemetry.sources()["speculative@stable"]
        assert stable.selector == 'namespace="prod",service="llama-stable"'
        assert stable.prometheus_url == settings.telemetry.arms["speculative"].prometheus_url

    def test_an_arm_not_in_arms_names_file_and_key(self, tmp_path: Path) -> None:
        """A misspelt arm is an error naming the file, the key and the arms there are."""
        with pytest.raises(ConfigError) as info:
            self.load(tmp_path, f'[telemetry.arms.speculativ]\nmetrics_url = "{URL}"\n')
        assert str(info.value) == (
            f"{tmp_path / 'canaryd.toml'}: telemetry.arms.speculativ: names no arm of "
            "[arms]; expected one of baseline, speculative (got 'speculativ')"
        )

    def test_a_bad_source_names_its_key(self, tmp_path: Path) -> None:
        """A bad value inside an arm's table names the arm's key."""
        with pytest.raises(ConfigError, match=r"telemetry\.arms\.speculative\.metrics_url: "):
            self.load(tmp_path, '[telemetry.arms.speculative]\nmetrics_url = "ftp://x"\n')

    def test_the_environment_overrides_the_interval(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """CANARYD_TELEMETRY__SCRAPE_INTERVAL_S beats the file, and is bounded like it."""
        monkeypatch.setenv("CANARYD_TELEMETRY__SCRAPE_INTERVAL_S", "0.5")
        with pytest.raises(ConfigError, match="CANARYD_TELEMETRY__SCRAPE_INTERVAL_S"):
            self.load(tmp_path, "[telemetry]\nscrape_interval_s = 30\n")


class TestStrictPromqlSource:
    """`prometheus_url` parsed strictly and `selector` checked as PromQL label matchers, in
    canaryd.toml: a bad one is a one-line error naming the file, the key and the fix."""

    @staticmethod
    def error(tmp_path: Path, key: str, value: str) -> str:
        path = tmp_path / "canaryd.toml"
        fields = {"prometheus_url": "http://prom:9090", "selector": "", key: value}
        path.write_text(
            "[telemetry.arms.speculative]\n"
            + "".join(f"{name} = {json.dumps(text)}\n" for name, text in fields.items())
        )
        with pytest.raises(ConfigError) as info:
            load_settings(path)
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(f"{path}: telemetry.arms.speculative.{key}: ")
        return message

    @pytest.mark.parametrize(
        "url",
        ["http://prom:9090/?tenant=a", "http://prom:9090/prometheus#x", "http://prom:9090?"],
    )
    def test_a_query_string_or_fragment_is_refused(self, tmp_path: Path, url: str) -> None:
        """It would send every query to the wrong path; the error says what to give."""
        message = self.error(tmp_path, "prometheus_url", url)
        assert "a query string or fragment would send every query astray" in message

    def test_the_query_endpoint_itself_is_refused(self, tmp_path: Path) -> None:
        message = self.error(tmp_path, "prometheus_url", "http://prom:9090/api/v1/query")
        assert "names the query API itself: give the base URL before /api/v1" in message

    def test_a_path_base_is_kept(self) -> None:
        """A querier behind a path (`/prometheus`) keeps it: the query API is below it."""
        config = arm(prometheus_url="http://gw:80/prometheus/", selector='a="b"')
        assert config.prometheus_url == "http://gw:80/prometheus/"

    @pytest.mark.parametrize(
        "selector",
        [
            "",
            'namespace="prod"',
            'namespace="prod",pod=~"spec-.*"',
            ' a != "x" , b !~ "y|z" ',
            "a='single', b=`raw \\d`",
            'a="esc\\"aped"',
        ],
    )
    def test_label_matcher_lists_are_accepted(self, selector: str) -> None:
        assert arm(prometheus_url="http://prom:9090", selector=selector).selector == selector

    @pytest.mark.parametrize(
        "selector",
        [
            "pod=spec",  # an unquoted value
            'a="b"} or vector(1) or up{c="d"',  # a query smuggled out of the braces
            'a="b",',  # a trailing comma: joined by commas, no empty matcher
            'a="b" c="d"',  # no comma
            'a~"x"',  # no such operator
            '"x"',  # no label name
            '1a="x"',  # not a label name
            'a="open',  # an unterminated string
        ],
    )
    def test_anything_else_is_refused(self, tmp_path: Path, selector: str) -> None:
        message = self.error(tmp_path, "selector", selector)
        assert "not a list of PromQL label matchers: write" in message
        assert 'name=~"regex"' in message


class TestReadBounds:
    def test_the_caps_default_generously_and_are_bounded(self) -> None:
        """64 `le` bounds per histogram (vLLM's have 15-25) and 4096 series per signal by
        default; at most 256 bounds, so three histograms always store in under 64 KB."""
        config = TelemetryConfig()
        assert (config.max_buckets, config.max_series) == (64, 4096)
        with pytest.raises(ValidationError, match="max_buckets"):
            TelemetryConfig(max_buckets=257)
        with pytest.raises(ValidationError, match="max_series"):
            TelemetryConfig(max_series=0)
