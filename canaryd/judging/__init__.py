"""Judging on the daemon's side: the gate job that judges the switch's arm and steps the
switch (`gatejob`), the verdict per revision that rollout tools read (`verdict`; its value
and JSON views in `revision_verdict`, its Kayenta shape in `kayenta`, the FAIL latch in
`latch`, the traffic-increase rule in `increase`), `canaryd judge`'s run (`oneshot`), which
daemon on a database leads (`leader`), which stored pairs and telemetry are evidence
(`evidence`), the one reader that gathers a judgement's evidence once (`reader`), the pair
rate (`rate`), the tie margin's calibration (`calibration`) and the enforce gates the
configured servers cannot feed (`inputs`). The judging itself is `gates.cycle.judge`, pure
and shared with the benchmarks."""
