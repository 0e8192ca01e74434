"""The progressive-delivery endpoints' answers: `GET /v1/verdict` (canaryd's body, its
compact form with `view=compact`, or Kayenta's judge result with `format=kayenta`),
`POST /v1/verdict` (the same answer, after opening the revision's evidence window when none
is open) and Flagger's webhooks `POST /v1/flagger/{pre-rollout,rollout,
confirm-traffic-increase,confirm-promotion,rollback}`.

`POST /v1/verdict` and every Flagger hook name their revision to the daemon's rollout
burst (`Burst`): while a rollout tool is judging a revision, pairs run faster until its
verdict decides; every answer then carries the estimate at the rate of that moment and
the burst's cost so far.

Reads never write: `GET /v1/verdict`, `confirm-promotion` and `rollback` judge a revision's
window as it is, and a revision nobody opened reads NODATA. Only `POST /v1/verdict`,
`pre-rollout` and `rollout` open a window (they need `server.auth_token`; without one they
are answered 403 unless `server.listen` is loopback, `canaryd.server.app`);
they and `confirm-traffic-increase` latch a FAIL they judge in the revision's window, and
`confirm-traffic-increase` marks each increase it allows (`VerdictService.increase`).
Every input is parsed strictly (whole-string patterns, ASCII digits with bounds) and a bad
one is answered 400 with a short reason that repeats at most `ECHO_CHARS` of it.

`ProgressiveDelivery` turns a request's query, headers or body into a `VerdictQuery`
(bad input: 400 naming the key), asks `VerdictService` for the verdict and answers with
a status and a JSON object. The status follows each caller's reading of it: Argo counts a
non-2xx answer as a measurement error, so every verdict is 200 and only "canaryd cannot
judge" is 503; Flagger retries 5xx answers and reads any other non-2xx as "no", so a
webhook answers 200 for yes and 412 with the reason for no.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol

import structlog

from canaryd.config import REVISION_PATTERN
from canaryd.errors import BadRequestError, CannotJudgeError
from canaryd.judging.kayenta import kayenta_result
from canaryd.judging.revision_verdict import RevisionVerdict
from canaryd.judging.verdict import VerdictQuery, VerdictService
from canaryd.server.app import VERDICT_PATH

__all__ = [
    "FLAGGER_HOOKS",
    "QUERY_KEYS",
    "REVISION_HEADER",
    "VIEWS",
    "Answer",
    "Burst",
    "ProgressiveDelivery",
]

log = structlog.get_logger(__name__)

FLAGGER_HOOKS = (
    "pre-rollout",
    "rollout",
    "confirm-traffic-increase",
    "confirm-promotion",
    "rollback",
)
# The hooks that may open a revision's window (the others only read).
OPENING_HOOKS = frozenset({"pre-rollout", "rollout"})
# The revision may come in a header instead of the query (a caller whose URL is fixed).
REVISION_HEADER = "x-canaryd-revision"
QUERY_KEYS = ("revision", "min_pairs", "category", "format", "view")
FORMATS = ("canaryd", "kayenta")
VIEWS = ("full", "compact")
MAX_MIN_PAIRS = 1_000_000
ECHO_CHARS = 64  # of a client's bad value, at most this much is repeated in a reason
_REVISION = re.compile(REVISION_PATTERN)

Answer = tuple[int, dict[str, Any]]


class Burst(Protocol):
    """The daemon's rollout burst, as the verdict endpoints see it."""

    def named(self, query: VerdictQuery, verdict: RevisionVerdict | None) -> None:
        """A rollout tool named `query.revision` now (`verdict`: its verdict, None when
        the window was just opened and not judged)."""

    def report(self, revision: str) -> dict[str, Any] | None:
        """The burst's cost on `revision` so far (None: no burst ever ran for it)."""


def _echo(value: str) -> str:
    """A client's value as a reason may repeat it: its first `ECHO_CHARS`, repr-quoted."""
    return repr(value[:ECHO_CHARS]) + ("…" if len(value) > ECHO_CHARS else "")


def _revision(value: str, key: str) -> str:
    if not _REVISION.fullmatch(value):
        raise BadRequestError(
            key, f"{_echo(value)} is not a revision: 1 to 128 printable ASCII characters, no spaces"
        )
    return value


def _min_pairs(value: str, key: str) -> int:
    digits = len(str(MAX_MIN_PAIRS))
    if not (value.isascii() and value.isdecimal() and len(value) <= digits):
        raise BadRequestError(
            key, f"{_echo(value)} is not a whole number from 0 to {MAX_MIN_PAIRS}"
        )
    if int(value) > MAX_MIN_PAIRS:
        raise BadRequestError(
            key, f"{_echo(value)} is not a whole number from 0 to {MAX_MIN_PAIRS}"
        )
    return int(value)


def _category(value: str, key: str) -> str:
    if not value:
        raise BadRequestError(key, "empty; leave it out to judge every category")
    return value


def verdict_query(
    params: Mapping[str, list[str]], headers: Mapping[str, str]
) -> tuple[VerdictQuery, str, str]:
    """The query of a `GET /v1/verdict`, its format and view; `BadRequestError` names the
    key."""
    unknown = sorted(set(params) - set(QUERY_KEYS))
    if unknown:
        raise BadRequestError(
            unknown[0][:ECHO_CHARS], f"unknown query key; expected {', '.join(QUERY_KEYS)}"
        )
    for key, values in params.items():
        if len(values) > 1:
            raise BadRequestError(key, f"given {len(values)} times; give it once")
    given = {key: values[0] for key, values in params.items()}
    header = headers.get(REVISION_HEADER)
    if "revision" in given and header is not None and header != given["revision"]:
        raise BadRequestError(
            "revision",
            f"the query names {_echo(given['revision'])} but the {REVISION_HEADER} header "
            f"{_echo(header)}; give one",
        )
    revision = given.get("revision", header)
    if revision is None:
        raise BadRequestError(
            "revision",
            "missing: name the revision the speculative arm serves, e.g. "
            f"{VERDICT_PATH}?revision=6b5b9c8d7f (or the {REVISION_HEADER} header)",
        )
    form = given.get("format", "canaryd")
    if form not in FORMATS:
        raise BadRequestError("format", f"{_echo(form)}; expected one of {', '.join(FORMATS)}")
    view = given.get("view", "full")
    if view not in VIEWS:
        raise BadRequestError("view", f"{_echo(view)}; expected one of {', '.join(VIEWS)}")
    if view != "full" and form != "canaryd":
        raise BadRequestError("view", f"view={view} is canaryd's body; leave out format={form}")
    query = VerdictQuery(
        revision=_revision(revision, "revision"),
        min_pairs=_min_pairs(given["min_pairs"], "min_pairs") if "min_pairs" in given else 0,
        category=_category(given["category"], "category") if "category" in given else None,
    )
    return query, form, view


def flagger_query(body: bytes) -> tuple[VerdictQuery, dict[str, str]]:
    """The query in a Flagger webhook payload (`checksum` is the revision; `min_pairs` and
    `category` may come in `metadata`), and who asked; `BadRequestError` names the field."""
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        raise BadRequestError("body", f"not JSON: {exc.msg} at {exc.pos}") from None
    except RecursionError:
        raise BadRequestError("body", "nested too deeply") from None
    except ValueError:  # not UTF-8, or an integer too long to read
        raise BadRequestError("body", "not UTF-8 JSON with readable numbers") from None
    if not isinstance(payload, dict):
        raise BadRequestError("body", "not a JSON object (Flagger sends name, namespace, …)")
    for key in ("name", "namespace", "phase", "checksum"):
        if not isinstance(payload.get(key), str) or not payload[key]:
            raise BadRequestError(key, "missing or not a non-empty string")
    metadata = payload.get("metadata") or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(value, str) for value in metadata.values()
    ):
        raise BadRequestError("metadata", "not an object of strings")
    query = VerdictQuery(
        revision=_revision(payload["checksum"], "checksum"),
        min_pairs=(
            _min_pairs(metadata["min_pairs"], "metadata.min_pairs")
            if "min_pairs" in metadata
            else 0
        ),
        category=(
            _category(metadata["category"], "metadata.category") if "category" in metadata else None
        ),
    )
    canary = {key: payload[key] for key in ("name", "namespace", "phase")}
    return query, canary


def _flagger_yes(hook: str, verdict: RevisionVerdict, hold: str | None = None) -> bool:
    """Whether a hook's answer is yes: a rollout goes on unless FAIL; more traffic only
    when nothing holds it (`hold`: why it must not grow, `canaryd.judging.increase`); a
    promotion needs a fresh PASS; a rollback happens only on FAIL, latched or the switch's
    rollback included."""
    if hook in OPENING_HOOKS:
        return verdict.verdict != "FAIL"
    if hook == "confirm-traffic-increase":
        return hold is None
    if hook == "confirm-promotion":
        return verdict.verdict == "PASS" and verdict.fresh
    return verdict.verdict == "FAIL"


class ProgressiveDelivery:
    """The status server's `Judge`: answers for `/v1/verdict` and the Flagger webhooks."""

    def __init__(self, service: VerdictService, burst: Burst | None = None) -> None:
        self.service = service
        self.burst = burst

    def _named(self, query: VerdictQuery, verdict: RevisionVerdict | None) -> None:
        if self.burst is not None:
            self.burst.named(query, verdict)

    def _reported(self, verdict: RevisionVerdict) -> RevisionVerdict:
        """`verdict` with the estimate at the rate of now and the burst's cost so far."""
        burst = self.burst.report(verdict.revision) if self.burst is not None else None
        return replace(self.service.rated(verdict), burst=burst)

    def verdict(
        self, params: Mapping[str, list[str]], headers: Mapping[str, str], *, write: bool = False
    ) -> Answer:
        """`GET /v1/verdict` (and, with `write`, `POST`, which first opens the revision's
        window): 200 with every verdict (FAIL included), 400 for bad input, 503 only when
        canaryd cannot judge."""
        try:
            query, form, view = verdict_query(params, headers)
            verdict = self.service.judge(query, start=write)
        except BadRequestError as exc:
            return 400, {"status": "bad request", "key": exc.key, "reason": str(exc)}
        except CannotJudgeError as exc:
            return 503, {"status": "unavailable", "fresh": False, "reason": exc.reason}
        if write:
            self._named(query, verdict)
        verdict = self._reported(verdict)
        if form == "kayenta":
            return 200, kayenta_result(verdict)
        return 200, verdict.as_json(view)

    def flagger(self, hook: str, body: bytes) -> Answer:
        """`POST /v1/flagger/<hook>`: 200 for yes, 412 with the reason for no, 400 for a
        payload that is not Flagger's, 404 for an unknown hook, 503 when canaryd cannot
        judge (Flagger retries it; a verdict is never 5xx)."""
        if hook not in FLAGGER_HOOKS:
            return 404, {
                "status": "not found",
                "reason": f"no Flagger hook {hook!r}; expected one of {', '.join(FLAGGER_HOOKS)}",
            }
        try:
            query, canary = flagger_query(body)
            if hook == "pre-rollout":
                window = self.service.open_revision(query.revision)
                self._named(query, None)
                log.info(
                    "verdict.flagger",
                    hook=hook,
                    canary=f"{canary['namespace']}/{canary['name']}",
                    phase=canary["phase"],
                    revision=query.revision,
                    answer=200,
                )
                return 200, {
                    "hook": hook,
                    "revision": window.revision,
                    "started_at": window.started_at.isoformat(),
                }
            hold: str | None = None
            if hook == "confirm-traffic-increase":
                verdict, hold = self.service.increase(query)
            else:
                verdict = self.service.judge(query, start=hook in OPENING_HOOKS)
        except BadRequestError as exc:
            return 400, {"status": "bad request", "key": exc.key, "reason": str(exc)}
        except CannotJudgeError as exc:
            return 503, {"status": "unavailable", "fresh": False, "reason": exc.reason}
        self._named(query, verdict)
        verdict = self._reported(verdict)
        yes = _flagger_yes(hook, verdict, hold)
        log.info(
            "verdict.flagger",
            hook=hook,
            canary=f"{canary['namespace']}/{canary['name']}",
            phase=canary["phase"],
            revision=query.revision,
            verdict=verdict.verdict,
            fresh=verdict.fresh,
            answer=200 if yes else 412,
            **({"hold": hold} if hold is not None else {}),
        )
        body_out: dict[str, Any] = {
            "hook": hook,
            "verdict": verdict.verdict,
            "fresh": verdict.fresh,
            "revision": verdict.revision,
            "pairs": verdict.pairs,
            "reason": verdict.reason,
            "failed_at": verdict.failed_at.isoformat() if verdict.failed_at else None,
            "speculative_enabled": verdict.speculative_enabled,
            "estimate": verdict.estimate(),
        }
        if hook == "confirm-traffic-increase":
            body_out["hold"] = hold  # why the weight holds; None: it may grow
        return (200 if yes else 412), body_out
