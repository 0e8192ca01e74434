"""The shipped progressive-delivery manifests (docs/examples/) are what Argo Rollouts and
Flagger accept: each validates against its CRD's schema (an excerpt carried as a fixture,
tests/fixtures/crds/SOURCES.md), strictly — an unknown field is an error, as with
`kubectl apply --validate=strict` — and uses canaryd's endpoints and fields as they are."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonschema
import pytest
import yaml

from benchmarks.rollout_sim.flagger import TOKEN_PLACEHOLDER
from canaryd.config import load_settings
from canaryd.judging.inputs import unprovided
from canaryd.server.rollout import FLAGGER_HOOKS, QUERY_KEYS

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples"
CRDS = REPO / "tests" / "fixtures" / "crds"


def strict(schema: Any) -> Any:
    """`schema` with unknown fields refused wherever the CRD lists an object's fields
    (Kubernetes prunes them silently; strict field validation refuses them)."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


def validate(manifest: dict[str, Any], fixture: str) -> None:
    crd = json.loads((CRDS / fixture).read_text(encoding="utf-8"))
    assert manifest["apiVersion"] == f"{crd['group']}/{crd['version']}"
    assert manifest["kind"] == crd["kind"]
    jsonschema.Draft7Validator(strict(crd["openAPIV3Schema"])).validate(manifest)


def load(name: str) -> dict[str, Any]:
    documents = list(yaml.safe_load_all((EXAMPLES / name).read_text(encoding="utf-8")))
    assert len(documents) == 1, name
    manifest: dict[str, Any] = documents[0]
    return manifest


class TestArgoRollouts:
    def test_the_analysis_template_validates_and_asks_canaryd_for_its_verdict(self) -> None:
        """The AnalysisTemplate is valid; its web metric polls /v1/verdict with known query
        keys, succeeds only on a fresh PASS, fails on FAIL, and lets undecided
        measurements accrue (inconclusiveLimit) until count ends it for a human."""
        template = load("argo/analysis-template.yaml")
        validate(template, "argo-analysis-template.schema.json")
        (metric,) = template["spec"]["metrics"]
        assert metric["successCondition"] == 'result.verdict == "PASS" && result.fresh'
        assert metric["failureCondition"] == 'result.verdict == "FAIL"'
        assert metric["failureLimit"] == 0
        assert metric["inconclusiveLimit"] >= metric["count"]
        url = urlsplit(metric["provider"]["web"]["url"].replace("{{args.canaryd-url}}", "http://x"))
        assert url.path == "/v1/verdict"
        assert set(parse_qs(url.query)) <= set(QUERY_KEYS)
        assert "revision" in parse_qs(url.query)
        assert parse_qs(url.query)["view"] == ["compact"]  # under 1 KB a measurement
        declared = {arg["name"] for arg in template["spec"]["args"]}
        assert {"revision", "canaryd-url"} <= declared

    def test_the_rollout_passes_the_new_pods_template_hash(self) -> None:
        """The Rollout is valid and its analysis step names the template and passes
        `revision` from the latest ReplicaSet's pod-template hash."""
        rollout = load("argo/rollout.yaml")
        validate(rollout, "argo-rollout.schema.json")
        steps = rollout["spec"]["strategy"]["canary"]["steps"]
        (analysis,) = [step["analysis"] for step in steps if "analysis" in step]
        assert analysis["templates"] == [{"templateName": "canaryd-verdict"}]
        assert analysis["args"] == [
            {"name": "revision", "valueFrom": {"podTemplateHashValue": "Latest"}}
        ]

    def test_a_typo_is_refused(self) -> None:
        """Strict validation catches a misspelt field (the check is not vacuous)."""
        template = load("argo/analysis-template.yaml")
        template["spec"]["metrics"][0]["inconclusiveLimt"] = 3
        with pytest.raises(jsonschema.ValidationError, match="inconclusiveLimt"):
            validate(template, "argo-analysis-template.schema.json")


class TestFlagger:
    def test_the_canary_validates_and_calls_each_canaryd_webhook(self) -> None:
        """The Canary is valid; it has one webhook per canaryd hook, of that type, posting
        to /v1/flagger/<type>."""
        canary = load("flagger/canary.yaml")
        validate(canary, "flagger-canary.schema.json")
        hooks = {h["type"]: h for h in canary["spec"]["analysis"]["webhooks"]}
        assert set(hooks) == set(FLAGGER_HOOKS)
        for kind, hook in hooks.items():
            assert urlsplit(hook["url"]).path == f"/v1/flagger/{kind}"
            assert set(hook.get("metadata", {})) <= {"min_pairs", "category", "token"}

    def test_every_webhook_carries_the_token_in_its_metadata_and_retries(self) -> None:
        """Flagger sends no headers: each webhook's `metadata.token` holds the placeholder
        the quick start replaces (the URL holds none: Flagger repeats a failing URL in its
        events), and `retries` makes Flagger retry a 5xx, as the guide says it does."""
        canary = load("flagger/canary.yaml")
        for hook in canary["spec"]["analysis"]["webhooks"]:
            assert hook["metadata"]["token"] == TOKEN_PLACEHOLDER, hook["name"]
            assert "token" not in parse_qs(urlsplit(hook["url"]).query), hook["name"]
            assert hook["retries"] >= 1, hook["name"]


class TestGuide:
    @pytest.mark.parametrize("example", ["argo/analysis-template.yaml", "flagger/canary.yaml"])
    def test_the_guide_shows_the_example_as_shipped(self, example: str) -> None:
        """progressive-delivery.md's copy of each manifest is the file's."""
        guide = (REPO / "docs" / "progressive-delivery.md").read_text(encoding="utf-8")
        shown = [
            yaml.safe_load(block)
            for block in re.findall(r"```yaml\n(.*?)```", guide, flags=re.DOTALL)
            if block.startswith("apiVersion:")
        ]
        assert load(example) in shown


class TestCanarydSide:
    @pytest.mark.parametrize("example", ["argo", "flagger"])
    def test_the_config_feeds_every_enforce_gate(self, example: str) -> None:
        """Each example's canaryd.toml loads, reads both arms' production telemetry, and
        leaves no enforce gate without its input (`canaryd.judging.inputs`): a healthy
        canary can PASS."""
        settings = load_settings(EXAMPLES / example / "canaryd.toml")
        assert set(settings.telemetry.arms) == {"baseline", "speculative"}
        assert settings.arms.arm("speculative").speculative  # type: ignore[union-attr]
        assert unprovided(settings) == []

    @pytest.mark.parametrize(
        ("example", "service"), [("argo", "vllm-spec-stable"), ("flagger", "vllm-spec-primary")]
    )
    def test_acceptance_is_judged_against_the_concurrent_stable(
        self, example: str, service: str
    ) -> None:
        """Each example names the pods still serving the previous revision (Argo's
        stableService, Flagger's primary) as the speculative arm's concurrent stable."""
        settings = load_settings(EXAMPLES / example / "canaryd.toml")
        stable = settings.telemetry.arms["speculative"].stable
        assert stable is not None and f'service="{service}"' in (stable.selector or "")
        if example == "argo":
            canary = load("argo/rollout.yaml")["spec"]["strategy"]["canary"]
            assert canary["stableService"] == service

    def test_the_argo_rollout_runs_a_vllm_that_reports_acceptance(self) -> None:
        """The Rollout's vLLM is 0.32 or later and asks for per-request acceptance."""
        rollout = load("argo/rollout.yaml")
        (container,) = rollout["spec"]["template"]["spec"]["containers"]
        version = container["image"].rsplit(":v", 1)[1]
        assert tuple(int(part) for part in version.split(".")[:2]) >= (0, 32)
        assert "--per-request-spec-decode-metrics=summary" in container["args"]
