"""Reading a mirrored OpenAI body: messages, own sampling (max_tokens capped), the
category the caller gives (never the body's), the keyed prompt hash, and hostile bodies
that are unusable without a trace of their text."""

from __future__ import annotations

import json
from typing import Any

import pytest

from canaryd.traffic.requests import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    UnusableRequestError,
    category_label,
    parse_request,
    prompt_hash,
    split_route,
)
from engine.types import Message

KEY = b"k" * 32


def parse(body: Any, endpoint: str = CHAT_PATH, **kwargs: Any) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request(raw, endpoint, hash_key=KEY, max_tokens_cap=256, **kwargs)


CHAT = {
    "model": "Llama-3.1-8B-Instruct",
    "messages": [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
        },
    ],
    "temperature": 0.3,
    "top_p": 0.9,
    "max_tokens": 1000,
    "stop": ["\n\n"],
    "stream": True,
}


class TestParseRequest:
    def test_chat_body_keeps_its_own_sampling_with_max_tokens_capped(self) -> None:
        """A streaming chat body is read for its messages and sampling; max_tokens is
        capped by config; developer reads as system."""
        request = parse(CHAT)
        assert request.messages == (
            Message(role="system", content="Be brief."),
            Message(role="user", content="Hi there"),
        )
        assert (request.temperature, request.top_p, request.max_tokens, request.stop) == (
            0.3,
            0.9,
            256,
            ("\n\n",),
        )
        assert request.category == "live"

    def test_completions_prompt_is_one_user_message_with_api_defaults(self) -> None:
        """A completions body without sampling gets the API's defaults."""
        request = parse({"prompt": "def f():", "stop": "\n"}, COMPLETIONS_PATH)
        assert request.messages == (Message(role="user", content="def f():"),)
        assert (request.temperature, request.top_p, request.max_tokens) == (1.0, 1.0, 256)
        assert request.stop == ("\n",)

    @pytest.mark.parametrize(
        ("body", "reason"),
        [
            (b"{not json", "body: not JSON"),
            ([1, 2], "body: not a JSON object"),
            ({"messages": []}, "messages: not a non-empty list"),
            ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
            (
                {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
                "messages[0]: a content part that is not text",
            ),
            ({"messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature"),
            ({"messages": [{"role": "user", "content": "x"}], "top_p": 0}, "top_p"),
            ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
            ({"messages": [{"role": "user", "content": "x"}], "stop": [1]}, "stop"),
        ],
    )
    def test_unusable_bodies_name_the_field(self, body: Any, reason: str) -> None:
        """Each unusable body raises with a reason that starts with the field it names."""
        with pytest.raises(UnusableRequestError) as caught:
            parse(body)
        assert caught.value.reason.startswith(reason)


MARKER = "zebra-ledger-marker"


def hostile_bodies() -> list[Any]:
    """Bodies that once made parsing raise something else than UnusableRequestError, each
    with the marker in its text."""
    user = {"role": "user", "content": f"my card is {MARKER}"}
    surrogate = {"messages": [{"role": "user", "content": f"{MARKER} \udc80"}]}
    return [
        pytest.param(json.dumps(surrogate).encode(), id="lone-surrogate"),
        pytest.param(
            json.dumps({"prompt": f"{MARKER} \ud800"}).encode(), id="lone-surrogate-prompt"
        ),
        pytest.param(
            json.dumps({"messages": [user], "stop": ["\udfff"]}).encode(), id="surrogate-stop"
        ),
        pytest.param(
            json.dumps({"messages": [user]}).encode()[:-1]
            + b', "max_tokens": '
            + b"7" * 5000
            + b"}",
            id="5000-digit-integer",
        ),
        pytest.param(
            json.dumps({"messages": [user]}).encode()[:-1]
            + b', "x": '
            + b"[" * 20_000
            + b"]" * 20_000
            + b"}",
            id="20k-deep",
        ),
        pytest.param(
            f'{{"messages": [{{"role": "user", "content": "{MARKER} '.encode() + b'\xff\xfe"}]}',
            id="invalid-utf-8",
        ),
        pytest.param(
            json.dumps({"messages": [{"role": [[MARKER]], "content": MARKER}]}).encode(),
            id="role-not-a-string",
        ),
        pytest.param(
            json.dumps({"messages": [user], "temperature": 10**400}).encode(), id="huge-int"
        ),
    ]


class TestHostileBodies:
    @pytest.mark.parametrize("raw", hostile_bodies())
    def test_each_is_unusable_without_its_text(self, raw: bytes) -> None:
        """Each malformed body is UnusableRequestError; neither its reason nor anything
        chained to it (cause, context) holds the body's text."""
        with pytest.raises(UnusableRequestError) as caught:
            parse(raw)
        error = caught.value
        assert MARKER not in error.reason
        assert error.__cause__ is None
        assert error.__context__ is None


class TestCategory:
    def test_the_category_is_the_callers_never_the_bodys(self) -> None:
        """The category is the one passed in (the gateway's); the body's `model` never
        names one, and without one it is `live`."""
        body = {"messages": [{"role": "user", "content": "q"}], "model": "gpt-4o"}
        assert parse(body, category="support").category == "support"
        assert parse(body).category == "live"

    def test_unusable_labels_fall_through(self) -> None:
        """A value that makes no category (empty, starting with a digit) is skipped."""
        assert category_label("") is None
        assert category_label("42") is None
        assert category_label("x" * 40) == "x" * 32

    def test_route_prefixes(self) -> None:
        """`/code/v1/chat/completions` has route `code`; another path is no endpoint."""
        assert split_route("/v1/chat/completions") == (None, CHAT_PATH)
        assert split_route("/code/v1/completions") == ("code", COMPLETIONS_PATH)
        assert split_route("/v1/models") is None


class TestPromptHash:
    def test_keyed_and_stable(self) -> None:
        """Equal messages hash equal under one key, differently under another."""
        messages = (Message(role="user", content="q"),)
        assert prompt_hash(KEY, messages) == prompt_hash(KEY, messages)
        assert prompt_hash(KEY, messages) != prompt_hash(b"other key 123456", messages)
        assert len(prompt_hash(KEY, messages)) == 64
