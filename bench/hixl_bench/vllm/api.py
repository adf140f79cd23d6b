"""A vLLM server's HTTP API as the P/D checks use it: completions, the P -> D flow, metrics.

Standard library only (urllib), blocking, every call bounded by a timeout.
Completions are greedy (temperature 0) with ``ignore_eos`` and
``return_token_ids``, so two servers' answers compare token by token and
always have ``max_tokens`` tokens.

The P -> D flow is the one of vLLM's toy proxy for NixlConnector: P gets the
prompt with ``kv_transfer_params={"do_remote_decode": true}`` and
``max_tokens=1``, computes the prompt's KV and keeps its blocks; its answer
carries ``kv_transfer_params`` (P's engine id, block ids, side channel); D
gets the same prompt with those parameters and the real ``max_tokens``, reads
the blocks from P and decodes.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ApiError",
    "Completion",
    "PdCompletion",
    "complete",
    "pd_complete",
    "prompt_tokens_by_source",
]

Prompt = Sequence[int] | str

# What vLLM's toy proxy sends P: no remote prefill, a remote decode.
_P_PARAMS: Mapping[str, Any] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None,
}
_METRIC = "vllm:prompt_tokens_by_source_total"
_SOURCE = re.compile(r'source="([^"]*)"')


class ApiError(RuntimeError):
    """A vLLM server answered with an HTTP error, or with something unexpected."""


@dataclass(frozen=True)
class Completion:
    """One completion's answer.

    Attributes:
        token_ids: the generated token ids.
        text: their text.
        kv_transfer_params: the answer's ``kv_transfer_params`` (P's, for D), or None.
        usage: the answer's ``usage`` (prompt_tokens, completion_tokens, ...).
        elapsed_s: the request's wall time, as the client saw it.
        ttft_s: time to the first token (streamed requests only), else None.
        finish_reason: why generation stopped ("length", "error", ...), unstreamed
            requests only, else None.
    """

    token_ids: tuple[int, ...]
    text: str
    kv_transfer_params: dict[str, Any] | None
    usage: dict[str, Any]
    elapsed_s: float
    ttft_s: float | None = None
    finish_reason: str | None = None


@dataclass(frozen=True)
class PdCompletion:
    """The two requests of one P -> D completion; ``decode`` holds the answer."""

    prefill: Completion
    decode: Completion
    elapsed_s: float


def _body(prompt: Prompt, max_tokens: int, kv_transfer_params: Mapping[str, Any] | None,
          stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": prompt if isinstance(prompt, str) else list(prompt),
        "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
        "return_token_ids": True, "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if kv_transfer_params is not None:
        body["kv_transfer_params"] = dict(kv_transfer_params)
    return body


def _open(url: str, body: Mapping[str, Any] | None, timeout_s: float) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(request, timeout=timeout_s)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:2000]
        raise ApiError(f"{url}: HTTP {exc.code}: {detail}") from exc


def _streamed(response: Any, started: float) -> tuple[list[int], str, dict[str, Any], float | None]:
    tokens: list[int] = []
    text: list[str] = []
    usage: dict[str, Any] = {}
    ttft: float | None = None
    for raw in response:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            break
        chunk = json.loads(payload)
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            ids = choice.get("token_ids") or []
            if (ids or choice.get("text")) and ttft is None:
                ttft = time.perf_counter() - started
            tokens += ids
            text.append(choice.get("text") or "")
    return tokens, "".join(text), usage, ttft


def complete(port: int, prompt: Prompt, max_tokens: int,
             kv_transfer_params: Mapping[str, Any] | None = None, *, stream: bool = False,
             timeout_s: float = 300.0, host: str = "127.0.0.1") -> Completion:
    """One greedy completion from the server at ``host:port``.

    Args:
        port: the server's HTTP port.
        prompt: token ids (sent as they are) or text.
        max_tokens: tokens to generate (EOS is ignored, so exactly this many).
        kv_transfer_params: sent as the request's ``kv_transfer_params``.
        stream: stream the answer, which measures ``ttft_s``; a streamed
            answer carries no ``kv_transfer_params``.
        timeout_s: bound on each socket operation of the request.
        host: the server's address.

    Returns:
        The completion.

    Raises:
        ApiError: an HTTP error or an answer without a choice.
        OSError: the server could not be reached.
    """
    url = f"http://{host}:{port}/v1/completions"
    started = time.perf_counter()
    with _open(url, _body(prompt, max_tokens, kv_transfer_params, stream), timeout_s) as response:
        if stream:
            tokens, text, usage, ttft = _streamed(response, started)
            return Completion(tuple(tokens), text, None, usage,
                              time.perf_counter() - started, ttft)
        answer = json.load(response)
    elapsed = time.perf_counter() - started
    choices = answer.get("choices") or []
    if not choices:
        raise ApiError(f"{url}: an answer without choices: {str(answer)[:500]}")
    return Completion(tuple(choices[0].get("token_ids") or ()), choices[0].get("text") or "",
                      answer.get("kv_transfer_params"), answer.get("usage") or {}, elapsed,
                      finish_reason=choices[0].get("finish_reason"))


def pd_complete(p_port: int, d_port: int, prompt: Prompt, max_tokens: int, *,
                stream_decode: bool = False, timeout_s: float = 300.0) -> PdCompletion:
    """A completion prefilled on P and decoded on D, as vLLM's toy proxy does it.

    Args:
        p_port: the prefill server's HTTP port.
        d_port: the decode server's HTTP port.
        prompt: token ids or text.
        max_tokens: tokens D generates.
        stream_decode: stream D's answer (measures D's time to first token).
        timeout_s: bound on each socket operation of each request.

    Returns:
        Both answers; ``decode`` is the completion.

    Raises:
        ApiError: an HTTP error, or P answered without ``kv_transfer_params``.
    """
    started = time.perf_counter()
    prefill = complete(p_port, prompt, 1, _P_PARAMS, timeout_s=timeout_s)
    if not prefill.kv_transfer_params:
        raise ApiError("P answered without kv_transfer_params: is its kv connector set up?")
    decode = complete(d_port, prompt, max_tokens, prefill.kv_transfer_params,
                      stream=stream_decode, timeout_s=timeout_s)
    return PdCompletion(prefill, decode, time.perf_counter() - started)


def prompt_tokens_by_source(port: int, timeout_s: float = 30.0,
                            host: str = "127.0.0.1") -> dict[str, float]:
    """``vllm:prompt_tokens_by_source_total`` from /metrics, summed over engines.

    Returns:
        Tokens per source: ``local_compute``, ``local_cache_hit``,
        ``external_kv_transfer`` (those the server reports).
    """
    with _open(f"http://{host}:{port}/metrics", None, timeout_s) as response:
        text = response.read().decode("utf-8", "replace")
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(_METRIC + "{"):
            continue
        labels, _, value = line.rpartition("}")
        source = _SOURCE.search(labels)
        if source is not None:
            counts[source[1]] = counts.get(source[1], 0.0) + float(value.split()[0])
    return counts
