"""What a mirrored request asks, read from its OpenAI-compatible body: the messages, the
category and the sampling a live pair replays it with, and the keyed hash that names it.

`parse_request` accepts a `POST /v1/chat/completions` body (text messages of the roles
`system`, `developer` (read as `system`), `user` and `assistant`; a content list is read
for its text parts) and a `POST /v1/completions` body (one `prompt` string, replayed as
one user message). Anything else is `UnusableRequestError`, with a reason that names the field,
never its value: bodies are user data, and nothing here logs them. That holds for hostile
bodies too — invalid UTF-8, text with lone surrogates, numbers with thousands of digits,
nesting thousands deep: each is an `UnusableRequestError` with a fixed reason, raised
outside the handler of the error that found it, so no traceback or exception context
carries the body along. The category is not read from the body (see
`canaryd.traffic.categories`): the caller passes it in.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from typing import Any, Final, Literal

from engine.types import Message, Role

__all__ = [
    "CHAT_PATH",
    "COMPLETIONS_PATH",
    "LIVE_CATEGORY",
    "LiveRequest",
    "UnusableRequestError",
    "category_label",
    "parse_request",
    "prompt_hash",
    "split_route",
]

CHAT_PATH: Final = "/v1/chat/completions"
COMPLETIONS_PATH: Final = "/v1/completions"
LIVE_CATEGORY: Final = "live"  # the category of a request nothing else names
# A category is a suite category's shape (suites.CATEGORY_PATTERN), so that live ones
# serve as metric labels and per-category switch keys like suite ones.
_CATEGORY: Final = re.compile(r"[a-z][a-z0-9_]{0,31}")
# Lone surrogates: JSON's \ud800 escapes decode to them, and no engine can encode them.
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_NOT_LABEL: Final = re.compile(r"[^a-z0-9_]+")
_ROLES: Final[dict[str, Role]] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}
_MAX_STOP: Final = 4  # as the OpenAI API


class UnusableRequestError(ValueError):
    """A mirrored body a pair cannot replay; `reason` names the field, not its value."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True, slots=True)
class LiveRequest:
    """One mirrored request as a live pair replays it: its own messages and sampling
    (`max_tokens` already capped), its category, and `prompt_hash`, the keyed hash of
    its messages that names it in the store instead of its text."""

    category: str
    messages: tuple[Message, ...]
    temperature: float
    top_p: float
    max_tokens: int
    stop: tuple[str, ...]
    prompt_hash: str

    @property
    def prompt_chars(self) -> int:
        return sum(len(message.content) for message in self.messages)


def category_label(value: str | None) -> str | None:
    """`value` as a category (lower case, runs of other characters as `_`, at most 32),
    None when nothing usable is left (empty, or not starting with a letter)."""
    if not value:
        return None
    label = _NOT_LABEL.sub("_", value.strip().lower())[:32].rstrip("_")
    return label if _CATEGORY.fullmatch(label) else None


def split_route(path: str) -> tuple[str | None, str] | None:
    """(`route`, endpoint) of a request path: `/v1/chat/completions` has no route,
    `/code/v1/chat/completions` the route `code` (accepted, never a category: the path
    is the client's); None for another path."""
    for endpoint in (CHAT_PATH, COMPLETIONS_PATH):
        if path == endpoint:
            return None, endpoint
        if path.endswith(endpoint):
            prefix = path[: -len(endpoint)].strip("/")
            return (prefix or None), endpoint
    return None


def prompt_hash(key: bytes, messages: tuple[Message, ...]) -> str:
    """HMAC-SHA256 of the messages under `key`, hex: equal prompts hash equal, and
    without the key nobody can test a guessed prompt against a stored hash."""
    canonical = json.dumps(
        [[m.role, m.content] for m in messages], separators=(",", ":"), ensure_ascii=False
    )
    return hmac.new(key, canonical.encode(), hashlib.sha256).hexdigest()


def _unicode(text: str, where: str) -> str:
    if not text.isascii() and _SURROGATE.search(text):
        raise UnusableRequestError(f"{where}: text that is not valid Unicode (a lone surrogate)")
    return text


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return _unicode(content, where)
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise UnusableRequestError(f"{where}: a content part that is not text")
            text = part.get("text")
            if not isinstance(text, str):
                raise UnusableRequestError(f"{where}: a text part without text")
            parts.append(text)
        return _unicode("".join(parts), where)
    raise UnusableRequestError(f"{where}: content is neither a string nor a list of parts")


def _messages(body: dict[str, Any], endpoint: str) -> tuple[Message, ...]:
    if endpoint == COMPLETIONS_PATH:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise UnusableRequestError("prompt: not one non-empty string")
        return (Message(role="user", content=_unicode(prompt, "prompt")),)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise UnusableRequestError("messages: not a non-empty list")
    messages = []
    for index, item in enumerate(raw):
        where = f"messages[{index}]"
        if not isinstance(item, dict):
            raise UnusableRequestError(f"{where}: not an object")
        given = item.get("role")
        role = _ROLES.get(given) if isinstance(given, str) else None
        if role is None:
            raise UnusableRequestError(f"{where}.role: not system, developer, user or assistant")
        messages.append(Message(role=role, content=_text(item.get("content"), where)))
    if messages[-1].role == "assistant":
        raise UnusableRequestError("messages: the last one is the assistant's")
    return tuple(messages)


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise UnusableRequestError(f"{key}: not a number in [{low:g}, {high:g}]")
    return float(value)


def _max_tokens(body: dict[str, Any], cap: int) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return cap
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnusableRequestError("max_tokens: not a positive integer")
    return min(value, cap)


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if (
        not isinstance(stops, list)
        or len(stops) > _MAX_STOP
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise UnusableRequestError(f"stop: not a string or a list of at most {_MAX_STOP} strings")
    return tuple(_unicode(stop, "stop") for stop in stops)


def parse_request(
    raw: bytes,
    endpoint: Literal["/v1/chat/completions", "/v1/completions"] | str,
    *,
    hash_key: bytes,
    max_tokens_cap: int,
    category: str = LIVE_CATEGORY,
) -> LiveRequest:
    """The live request in a mirrored body, in `category` (the caller's, from the
    gateway: `canaryd.traffic.categories`). Sampling absent from the body is the API's
    default (temperature 1, top_p 1, `max_tokens` the cap); streaming is ignored (the
    sink never streams). Every unusable body, however malformed, is
    `UnusableRequestError` and nothing else."""
    reason: str
    try:
        return _parse(raw, endpoint, hash_key, max_tokens_cap, category)
    except UnusableRequestError:
        raise
    except RecursionError:
        reason = "body: nested too deeply"
    except UnicodeError:
        reason = "body: not valid UTF-8 text"
    except json.JSONDecodeError:
        reason = "body: not JSON"
    except ValueError:
        reason = "body: not JSON this sink reads (a number with too many digits?)"
    except (OverflowError, TypeError):
        reason = "body: a value out of range"
    # Raised here, outside the handlers, so that the error carries no context: the
    # original exceptions quote the body.
    raise UnusableRequestError(reason)


def _parse(
    raw: bytes, endpoint: str, hash_key: bytes, max_tokens_cap: int, category: str
) -> LiveRequest:
    body = json.loads(raw)
    if not isinstance(body, dict):
        raise UnusableRequestError("body: not a JSON object")
    messages = _messages(body, endpoint)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p <= 0:
        raise UnusableRequestError("top_p: not a number in (0, 1]")
    return LiveRequest(
        category=category,
        messages=messages,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=top_p,
        max_tokens=_max_tokens(body, max_tokens_cap),
        stop=_stop(body),
        prompt_hash=prompt_hash(hash_key, messages),
    )
