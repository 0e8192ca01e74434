"""The switch policy: a pure state machine from gate evaluations and human commands to the
rollback switch's state (`policy`), and its configuration (`config`)."""
