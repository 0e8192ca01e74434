"""Live traffic: the mirror sink that receives a gateway's copies of production requests
(`sink`), what each one asks (`requests`), which live category it belongs to
(`categories`: the gateway's header, on an allowlist), and the bounded sample of them
that the daemon replays as live pairs (`reservoir`)."""

from canaryd.traffic.categories import CategoryPolicy
from canaryd.traffic.requests import LIVE_CATEGORY, LiveRequest, UnusableRequestError
from canaryd.traffic.reservoir import OUTCOMES, LiveSampler, SamplingBounds
from canaryd.traffic.sink import TrafficSink

__all__ = [
    "LIVE_CATEGORY",
    "OUTCOMES",
    "CategoryPolicy",
    "LiveRequest",
    "LiveSampler",
    "SamplingBounds",
    "TrafficSink",
    "UnusableRequestError",
]
