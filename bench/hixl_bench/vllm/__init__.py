"""Real vLLM (CPU build) servers for prefill/decode checks and benchmarks.

The servers run in a vLLM environment of their own (``scripts/vllm_env.sh``);
this package, run from hixl's environment, starts them (:mod:`.servers`),
places and ends their threads and processes through /proc (:mod:`.procs`) and
talks to them over HTTP (:mod:`.api`), with the standard library only.
``tiny_model.py`` is a script for the vLLM environment that writes a small
random Llama; ``python -m hixl_bench.vllm.nixl_check`` runs vLLM's own
NixlConnector P -> D and checks it against D alone, ``python -m
hixl_bench.vllm.pd`` does the same with hixl's HixlConnector, ``python -m
hixl_bench.vllm.compare`` times both side by side, and ``python -m
hixl_bench.vllm.ttft`` times push mode (through HixlConnector's proxy,
:mod:`.proxy_process`), pull mode and NixlConnector to the first decoded token.
"""

from hixl_bench.vllm.api import (
    ApiError,
    Completion,
    PdCompletion,
    complete,
    pd_complete,
    prompt_tokens_by_source,
)
from hixl_bench.vllm.servers import (
    ServerSpec,
    ServerStartError,
    VllmServer,
    ensure_vllm_python,
    free_ports,
    start_server,
    start_servers,
)

__all__ = [
    "ApiError",
    "Completion",
    "PdCompletion",
    "ServerSpec",
    "ServerStartError",
    "VllmServer",
    "complete",
    "ensure_vllm_python",
    "free_ports",
    "pd_complete",
    "prompt_tokens_by_source",
    "start_server",
    "start_servers",
]
