"""canaryd.store.text: a pair's NUL characters become U+FFFD wherever its text is, and a
pair without one is returned as it is."""

from __future__ import annotations

from dataclasses import replace

from canaryd.store.text import storable
from engine.types import Message
from gates.pairs.testing import record
from gates.records import Prompt


class TestStorable:
    def test_every_nul_is_replaced(self) -> None:
        """NUL in a prompt's message and reference and in an output become U+FFFD; the
        rest of the pair stays as it was."""
        dirty = record(1)
        dirty = replace(
            dirty,
            prompt=Prompt("qa-1", "qa", (Message("user", "say a\x00b"),), 64, "\x00"),
            speculative=replace(dirty.speculative, text="x\x00y\x00"),
        )
        cleaned, changed = storable(dirty)
        assert changed
        assert cleaned.prompt.messages[0].content == "say a\ufffdb"
        assert cleaned.prompt.reference == "\ufffd"
        assert cleaned.speculative.text == "x\ufffdy\ufffd"
        assert cleaned.baseline == dirty.baseline
        assert "\x00" not in repr(cleaned)

    def test_a_clean_pair_is_the_same_object(self) -> None:
        """Nothing to replace: the record itself, unchanged, so callers can count."""
        clean = record(1)
        assert storable(clean) == (clean, False)
        assert storable(clean)[0] is clean
