"""The probe's view of one answer: a failure described in words a log line can carry,
never "ok" for an answer that was judged a failure."""

from __future__ import annotations

import pytest

from canaryd.parity.client import Answer


class TestAnswerDescribe:
    @pytest.mark.parametrize(
        ("answer", "says"),
        [
            (Answer(400, "context too long"), "HTTP 400: context too long"),
            (Answer(None, "ConnectError"), "ConnectError"),
            (Answer(200, "invalid JSON"), "invalid JSON"),
            (Answer(200), "HTTP 200 with no text"),
            (Answer(200, texts={0: "  "}), "HTTP 200 with no text"),
            (Answer(200, texts={0: "mars"}), "HTTP 200"),
        ],
    )
    def test_says_what_came_back(self, answer: Answer, says: str) -> None:
        """The status and error, or what a well-formed answer held: never a bare "ok"."""
        assert answer.describe() == says
