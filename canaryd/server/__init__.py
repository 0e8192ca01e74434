"""The status port: the ASGI app behind `/metrics`, `/healthz`, `/readyz`, `/v1/switch`,
`/v1/verdict` and Flagger's webhooks, and the uvicorn plumbing (deadlines, connection
cap) that the mirror sink shares (`app`); the rollout tools' answers (`rollout`)."""
