"""Capability parity: does the speculative arm still do everything the baseline does?

A probe (`canaryd probe`, and the daemon's every `schedule.probe_interval_s`) sends a fixed
checklist of requests — streaming against non-streaming, stop sequences,
`max_tokens = 1`, log-probs, `n > 1`, seeded sampling, a JSON schema, a long context and
one over the limit, odd input, a burst of 16, streams cancelled mid-flight — to both arms
of OpenAI-compatible servers, the same request to each, and judges every answer on its
own. The result is a table of capability × arm (pass, fail or unsupported, with the
reason); a capability the baseline passes and the speculative arm does not is a
regression. Only what servers answer is probed: the in-process arms have no server to ask.

The package's modules, by concern: `client` (HTTP to one arm's server, every answer
read within bounds), `checks` (one function per capability), `run` (one probe run of the
checklist on both arms, within one deadline), `report` (the table it yields), `stored`
(the latest stored probe of the arms as configured now, the parity gate's evidence) and
`routing` (the state file's per-request routing around what the speculative arm lacks).
Capability parity is not the daemon's health probes (`canaryd.daemon.probes`).
"""
