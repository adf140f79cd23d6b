"""hixl_client.vllm: the vLLM KV connector (disaggregated prefill/decode on hixl).

Needs vLLM (the optional extra ``hixl[vllm]``); nothing else in hixl_client
imports this package. vLLM loads the connector by module path::

    --kv-transfer-config '{"kv_connector": "HixlConnector",
                           "kv_connector_module_path": "hixl_client.vllm",
                           "kv_role": "kv_both"}'

docs/vllm.md, "Using hixl with vLLM", has the commands for one host and for two.
"""

from ._connector import HixlConnector

__all__ = ["HixlConnector"]
