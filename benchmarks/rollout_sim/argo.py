"""Argo Rollouts' analysis of one web metric, counted as its controller counts (pure).

Read from argoproj/argo-rollouts (Apache-2.0) at 9f8d111: `metricproviders/webmetric`
(a non-2xx answer, a failed request or an unparsable condition is a measurement *Error*;
the JSON body, through `jsonPath`, is `result`), `utils/evaluate/evaluate.go` (failure
wins over success; neither is Inconclusive) and `analysis/analysis.go` (`runMeasurements`:
Successful, Failed and Inconclusive count toward `count` and reset the consecutive
errors, an Error does not count toward `count`; every phase but Successful resets the
consecutive successes. `assessMetricStatus`: Failed past `failureLimit`, Inconclusive past
`inconclusiveLimit`, Error past `consecutiveErrorLimit` (in that order of precedence,
the last one found wins); then Successful at `consecutiveSuccessLimit` successes in a
row; at `count` with a success limit not reached, Inconclusive). The next measurement
starts `interval` after the last one finished (10 s after an Error).

`evaluate` runs the subset of expr (expr-lang/expr) that conditions on a JSON body use:
`result.a.b`, string, number and boolean literals, `nil`, `==`, `!=`, `<`, `<=`, `>`,
`>=`, `&&`/`and`, `||`/`or`, `!`/`not` and parentheses; a missing key reads `nil`, and a
logical operator on something that is not a boolean is an error, as in expr.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml  # type: ignore[import-untyped]  # the dev install has no stubs

from benchmarks.rollout_sim.durations import seconds

Phase = Literal["Successful", "Failed", "Inconclusive", "Error"]
ERROR_RETRY_INTERVAL_S = 10.0  # analysis.DefaultErrorRetryInterval: the next try after an Error


class ConditionError(ValueError):
    """A condition that expr would refuse to compile or run."""


# -- the condition language --------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<number>\d+(?:\.\d+)?)|(?P<string>\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')"
    r"|(?P<op>==|!=|<=|>=|&&|\|\||[<>!().])|(?P<name>[A-Za-z_][A-Za-z0-9_]*))"
)


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise ConditionError(f"unexpected character at {position}: {text[position:]!r}")
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match.group(kind)))
        position = match.end()
    return tokens


class _Parser:
    """Recursive descent: or > and > not > comparison > primary (expr's precedence)."""

    def __init__(self, text: str, result: Any) -> None:
        self.tokens = _tokens(text)
        self.position = 0
        self.result = result

    def peek(self) -> str | None:
        return self.tokens[self.position][1] if self.position < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        if self.position >= len(self.tokens):
            raise ConditionError("unexpected end of condition")
        token = self.tokens[self.position]
        self.position += 1
        return token

    def whole(self) -> Any:
        value = self.disjunction()
        if self.position != len(self.tokens):
            raise ConditionError(f"unexpected {self.peek()!r}")
        return value

    def disjunction(self) -> Any:
        value = self.conjunction()
        while self.peek() in ("||", "or"):
            self.take()
            left = _boolean(value)
            right = self.conjunction()  # parsed either way; expr short-circuits the run
            value = True if left else _boolean(right)
        return value

    def conjunction(self) -> Any:
        value = self.negation()
        while self.peek() in ("&&", "and"):
            self.take()
            left = _boolean(value)
            right = self.negation()
            value = False if not left else _boolean(right)
        return value

    def negation(self) -> Any:
        if self.peek() in ("!", "not"):
            self.take()
            return not _boolean(self.negation())
        return self.comparison()

    def comparison(self) -> Any:
        left = self.primary()
        if self.peek() in ("==", "!=", "<", "<=", ">", ">="):
            _, op = self.take()
            right = self.primary()
            if op == "==":
                return left == right
            if op == "!=":
                return left != right
            if not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in (left, right)
            ):
                raise ConditionError(f"invalid operation: {left!r} {op} {right!r}")
            return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[
                op
            ]
        return left

    def primary(self) -> Any:
        kind, text = self.take()
        if text == "(":
            value = self.disjunction()
            if self.take()[1] != ")":
                raise ConditionError("missing )")
            return value
        if kind == "number":
            return float(text) if "." in text else int(text)
        if kind == "string":
            return json.loads(text) if text[0] == '"' else text[1:-1].replace("\\'", "'")
        if kind == "name":
            if text in ("true", "false"):
                return text == "true"
            if text == "nil":
                return None
            if text != "result":
                raise ConditionError(f"unknown name {text!r}")
            member: Any = self.result
            while self.peek() == ".":
                self.take()
                key_kind, key = self.take()
                if key_kind != "name":
                    raise ConditionError(f"bad member {key!r}")
                member = member.get(key) if isinstance(member, Mapping) else None
            return member
        raise ConditionError(f"unexpected {text!r}")


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConditionError(f"expected bool, but got {type(value).__name__}")
    return value


def evaluate(condition: str, result: Any) -> bool:
    """The condition's value on `result` (expr's `EvalCondition`); ConditionError as expr
    would fail it."""
    return _boolean(_Parser(condition, result).whole())


# -- the metric ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WebMetric:
    """One metric of an AnalysisTemplate with a web provider, its args substituted."""

    name: str
    interval_s: float
    count: int
    success_condition: str
    failure_condition: str
    consecutive_success_limit: int
    failure_limit: int
    inconclusive_limit: int
    consecutive_error_limit: int
    url: str
    method: str
    timeout_s: float
    headers: tuple[tuple[str, str], ...]
    json_path: str


_ARG = re.compile(r"\{\{\s*args\.([A-Za-z0-9_-]+)\s*\}\}")


def load_template(path: Path, args: Mapping[str, str]) -> WebMetric:
    """The template's only metric, `{{args.*}}` replaced by `args` or the template's own
    values (an argument with neither, e.g. a Secret's, is an error)."""
    documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    [template] = [d for d in documents if d.get("kind") == "AnalysisTemplate"]
    values: dict[str, str] = {
        str(a["name"]): str(a["value"]) for a in template["spec"].get("args", ()) if "value" in a
    }
    values.update(args)

    def substitute(text: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in values:
                raise KeyError(f"{path}: argument {name!r} has no value")
            return values[name]

        return _ARG.sub(one, text)

    [metric] = template["spec"]["metrics"]
    web = metric["provider"]["web"]
    return WebMetric(
        name=metric["name"],
        interval_s=seconds(str(metric.get("interval", "0s"))),
        count=int(metric.get("count", 0)),
        success_condition=metric.get("successCondition", ""),
        failure_condition=metric.get("failureCondition", ""),
        consecutive_success_limit=int(metric.get("consecutiveSuccessLimit", 0)),
        failure_limit=int(metric.get("failureLimit", 0)),
        inconclusive_limit=int(metric.get("inconclusiveLimit", 0)),
        # Argo's default (DefaultConsecutiveErrorLimit) when the template sets none
        consecutive_error_limit=int(metric.get("consecutiveErrorLimit", 4)),
        url=substitute(web["url"]),
        method=web.get("method", "GET"),
        timeout_s=float(web.get("timeoutSeconds", 10)),
        headers=tuple((h["key"], substitute(h["value"])) for h in web.get("headers", ())),
        json_path=web.get("jsonPath", "{$}"),
    )


ROLLOUT_ACTION: dict[Phase, str] = {
    "Successful": "the Rollout goes on to its next step",
    "Failed": "the Rollout aborts (traffic back to stable)",
    "Error": "the Rollout aborts (traffic back to stable)",
    "Inconclusive": "the Rollout pauses for a human (promote or abort)",
}


def analysis_weight(path: Path) -> int:
    """The canary weight a Rollout's steps set before its first analysis step (0: none)."""
    documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    [rollout] = [d for d in documents if d.get("kind") == "Rollout"]
    weight = 0
    for step in rollout["spec"]["strategy"]["canary"].get("steps", ()):
        if "analysis" in step:
            break
        weight = int(step.get("setWeight", weight))
    return weight


def _json_path(path: str, body: Any) -> Any:
    """`{$}` or `{$.a.b}` (what a template points at a JSON object with)."""
    inner = path.strip()
    if not (inner.startswith("{") and inner.endswith("}")):
        raise ConditionError(f"jsonPath {path!r} is not {{...}}")
    parts = [p for p in inner[1:-1].strip().lstrip("$").split(".") if p]
    for part in parts:
        if not isinstance(body, Mapping) or part not in body:
            raise ConditionError(f"Could not find JSONPath in body: {part!r} is not found")
        body = body[part]
    return body


def measurement_phase(metric: WebMetric, status: int | None, body: bytes) -> tuple[Phase, str]:
    """One measurement's phase and message from the HTTP answer (`status` None: the
    request failed or timed out)."""
    if status is None:
        return "Error", body.decode(errors="replace")[:200] or "request failed"
    if not 200 <= status < 300:
        return "Error", f"received non 2xx response code: {status}"
    try:
        data: Any = json.loads(body)
    except ValueError:
        data = body.decode(errors="replace")  # conditions then run on the string
    else:
        try:
            data = _json_path(metric.json_path, data)
        except ConditionError as exc:
            return "Error", str(exc)
    try:
        succeeded = evaluate(metric.success_condition, data) if metric.success_condition else False
        failed = evaluate(metric.failure_condition, data) if metric.failure_condition else False
    except ConditionError as exc:
        return "Error", f"could not evaluate a condition: {exc}"
    if not metric.success_condition and not metric.failure_condition:
        return "Successful", ""
    if metric.success_condition and not metric.failure_condition:
        failed = not succeeded
    elif metric.failure_condition and not metric.success_condition:
        succeeded = not failed
    if failed:
        return "Failed", ""
    return ("Successful" if succeeded else "Inconclusive"), ""


@dataclass(slots=True)
class MetricResult:
    """Argo's `MetricResult` counters and, once decided, the metric's phase."""

    count: int = 0
    successful: int = 0
    failed: int = 0
    inconclusive: int = 0
    error: int = 0
    consecutive_success: int = 0
    consecutive_error: int = 0
    phase: Phase | None = None  # None: Running
    message: str = ""
    phases: list[Phase] = field(default_factory=list)

    def record(self, metric: WebMetric, phase: Phase) -> None:
        """Count one measurement (`runMeasurements`) and assess the metric."""
        self.phases.append(phase)
        if phase == "Error":
            self.error += 1
            self.consecutive_error += 1
            self.consecutive_success = 0
        else:
            self.count += 1
            self.consecutive_error = 0
            if phase == "Successful":
                self.successful += 1
                self.consecutive_success += 1
            else:
                self.consecutive_success = 0
                if phase == "Failed":
                    self.failed += 1
                else:
                    self.inconclusive += 1
        self.phase, self.message = assess(metric, self)


def assess(metric: WebMetric, result: MetricResult) -> tuple[Phase | None, str]:
    """`assessMetricStatus` after a completed measurement: the metric's phase, or None
    while it runs on."""
    phase: Phase | None = None
    message = ""
    if metric.failure_limit >= 0 and result.failed > metric.failure_limit:
        phase, message = (
            "Failed",
            f"failed ({result.failed}) > failureLimit ({metric.failure_limit})",
        )
    if result.inconclusive > metric.inconclusive_limit:
        phase = "Inconclusive"
        message = (
            f"inconclusive ({result.inconclusive}) > "
            f"inconclusiveLimit ({metric.inconclusive_limit})"
        )
    if result.consecutive_error > metric.consecutive_error_limit:
        phase = "Error"
        message = (
            f"consecutiveErrors ({result.consecutive_error}) > consecutiveErrorLimit "
            f"({metric.consecutive_error_limit})"
        )
    if phase is not None:
        return phase, message
    limit = metric.consecutive_success_limit
    if limit > 0 and result.consecutive_success >= limit:
        return "Successful", f"ConsecutiveSuccessLimit ({limit}) Reached"
    if metric.count > 0 and result.count >= metric.count:
        if limit > 0 and metric.failure_limit >= 0:
            return "Inconclusive", (
                f"ConsecutiveSuccessLimit ({limit}) Not Reached and FailureLimit "
                f"({metric.failure_limit}) Not Violated"
            )
        if limit > 0:
            return "Failed", f"ConsecutiveSuccessLimit ({limit}) Not Reached"
        return "Successful", f"Count ({metric.count}) Reached"
    return None, ""


def next_measurement_after(metric: WebMetric, phase: Phase) -> float:
    """Seconds from a measurement's end to the next one (`calculateNextReconcileTime`)."""
    return ERROR_RETRY_INTERVAL_S if phase == "Error" else metric.interval_s
