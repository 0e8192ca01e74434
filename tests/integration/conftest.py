"""Fixtures the integration modules share: the real vLLM pair is registered here, once, so
every module that asks for `vllm_servers` gets the same session pair."""

from tests.integration.vllm_pair import vllm_servers

__all__ = ["vllm_servers"]
