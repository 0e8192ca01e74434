"""Judging on the daemon's side: the gate job that judges the switch's arm and steps the
switch (`gatejob`), the verdict per revision that rollout tools read (`verdict`, and its
Kayenta shape in `kayenta`), which daemon on a database leads (`leader`), and which stored
pairs are evidence (`evidence`). The judging itself is `gates.cycle.judge`, pure and shared
with `canaryd judge` and the benchmarks."""
