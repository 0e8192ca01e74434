"""`canaryd once` (placeholder until implemented)."""


def once() -> None:
    """Run N pairs now."""
