"""A rollout played in real time against a real `canaryd run`, as Argo Rollouts and Flagger count.

Two loopback vLLM-like arms (`servers`: OpenAI-compatible streaming, vLLM's /metrics with
production traffic for `[telemetry]`; `arms`: what they answer, per-token pace, other
text, HTTP 500, host stalls that hit one arm of the pairs a burst runs at once), a
`canaryd run` subprocess (`daemon`) on the tool's shipped canaryd.toml pointed at loopback
(`config`), and the shipped `docs/examples` played as each tool plays them:
Argo's AnalysisTemplate (`argo`: measurements, conditions, limits) and Flagger's Canary
(`flagger`: iterations, webhooks, weight steps, failed checks). `scenarios` holds the
scenarios and what each should end in; `play` runs one; `__main__` is the command:

    .venv/bin/python benchmarks/rollout_sim --scenario healthy --tool argo [--runs N]
        [--time-scale S] [--out FILE]

Each run prints and writes one JSON row: scenario, tool, outcome as the tool counts it
(Successful / Failed / Error / Inconclusive; promoted / rolled back / stuck), minutes from
the first POST or pre-rollout iteration to it, the revision's pairs, Flagger's highest
weight, the reason (the tool's and canaryd's), whether it is what the scenario expects,
and the stalls and requests the arms saw. docs/progressive-delivery.md says how to run it.
"""
