"""hixl_client.vllm: the vLLM KV connector (disaggregated prefill/decode on hixl).

Needs vLLM (the optional extra ``hixl[vllm]``); nothing else in hixl_client
imports this package. vLLM loads the connector by module path::

    --kv-transfer-config '{"kv_connector": "HixlConnector",
                           "kv_connector_module_path": "hixl_client.vllm",
                           "kv_role": "kv_both"}'

docs/vllm.md, "Using hixl with vLLM", has the commands for one host and for two.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._connector import HixlConnector

__all__ = ["HixlConnector"]


def __getattr__(name: str) -> Any:
    # vLLM is imported when the connector is asked for (vLLM does that by
    # module path), so the parts that need no vLLM (``_kv_map``, ``_params``)
    # import and test without it.
    if name == "HixlConnector":
        from ._connector import HixlConnector
        return HixlConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
