"""engine.sse: the line splitter cuts a body into the lines `str.splitlines` finds
however the bytes arrive, and the byte cap grows with `max_tokens`. (Reading streams
against real servers is tested through the engine: tests/engine/test_http_engine.py.)"""

from __future__ import annotations

import random

from engine.sse import (
    OUTPUT_BYTES_PER_TOKEN,
    OUTPUT_CAP_DETAIL,
    OUTPUT_FRAMING_BYTES,
    LineSplitter,
    output_byte_cap,
    over_output_cap,
)
from engine.types import ErrorKind, GenerationResult

PIECES = ("data: {}", "a", "é", "🚀", "\n", "\r", "\r\n", "\n\n", "\u2028", " ")


class TestLineSplitter:
    def test_lines_do_not_depend_on_where_the_reads_cut(self) -> None:
        """Any text cut into reads at any byte (inside a UTF-8 character, between `\\r`
        and `\\n`) splits into `text.splitlines()`."""
        chooser = random.Random(7)
        for _ in range(2000):
            text = "".join(chooser.choice(PIECES) for _ in range(chooser.randint(0, 24)))
            data = text.encode()
            cuts = sorted(chooser.sample(range(len(data) + 1), min(len(data) + 1, 4)))
            splitter, lines, start = LineSplitter(), [], 0
            for end in [*cuts, len(data)]:
                lines += splitter.feed(data[start:end])
                start = end
            lines += splitter.flush()
            assert lines == text.splitlines(), repr(text)

    def test_undecodable_bytes_are_replaced(self) -> None:
        """Bytes that are not UTF-8 become U+FFFD, as httpx decodes them."""
        splitter = LineSplitter()
        assert splitter.feed(b"data: \xff\xfe\n") == ["data: \ufffd\ufffd"]


class TestOutputCap:
    def test_the_cap_grows_with_max_tokens(self) -> None:
        """1 KiB per requested token and 64 KiB of framing; max_tokens 0 counts as 1."""
        assert output_byte_cap(128) == 128 * OUTPUT_BYTES_PER_TOKEN + OUTPUT_FRAMING_BYTES
        assert output_byte_cap(0) == output_byte_cap(1) == 1024 + 64 * 1024

    def test_only_the_cap_detail_marks_a_capped_result(self) -> None:
        """`over_output_cap` is true for the cap's own failure, not other invalid output."""
        capped = GenerationResult.failed(ErrorKind.INVALID_OUTPUT, f"{OUTPUT_CAP_DETAIL}: x", 1)
        other = GenerationResult.failed(ErrorKind.INVALID_OUTPUT, "output_tokens -1", 1)
        timeout = GenerationResult.failed(ErrorKind.TIMEOUT, OUTPUT_CAP_DETAIL, 1)
        assert [over_output_cap(r) for r in (capped, other, timeout)] == [True, False, False]
