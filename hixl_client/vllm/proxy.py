"""A small proxy for disaggregated prefill/decode with HixlConnector.

It takes vLLM's toy proxy's flags and serves the same endpoints
(``/v1/completions``, ``/v1/chat/completions``, ``/healthcheck``)::

    python -m hixl_client.vllm.proxy --port 8192 \\
        --prefiller-hosts 127.0.0.1 --prefiller-ports 8100 \\
        --decoder-hosts 127.0.0.1 --decoder-ports 8200 [--mode push]

``--mode pull`` (the default) is vLLM's flow: the prefill instance runs the
prompt (one token), then the decode instance gets its ``kv_transfer_params``
and loads the KV. ``--mode push`` sends both requests at once, the decode
one naming the prefill instance and both carrying one transfer key: the
decode instance allocates its blocks and asks for them at once, and the
prefill instance pushes each layer while it computes the rest (both run
HixlConnector with ``"mode": "push"``). The proxy learns a prefill
instance's identity once, with a probe request that keeps nothing. A prefill
instance that does not push gets vLLM's flow.

It runs with vLLM's own dependencies (aiohttp), in vLLM's environment.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import logging
import uuid
from collections.abc import Iterator
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

from ._params import DO_REMOTE_DECODE, DO_REMOTE_PREFILL, MODE, PROBE, TRANSFER

logger = logging.getLogger("hixl_client.vllm.proxy")

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
PROBE_PROMPT = "hixl"


def _prefill_body(body: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The prefill instance's request: one token, no stream, these params."""
    prefill = copy.deepcopy(body)
    prefill["max_tokens"] = 1
    if "max_completion_tokens" in prefill:
        prefill["max_completion_tokens"] = 1
    prefill["stream"] = False
    prefill.pop("stream_options", None)
    prefill["kv_transfer_params"] = params
    return prefill


class Proxy:
    """Round robin over the instances; one HTTP session for all requests."""

    def __init__(self, prefillers: list[str], decoders: list[str], mode: str,
                 timeout_s: float) -> None:
        self._prefillers: Iterator[str] = itertools.cycle(prefillers)
        self._decoders: Iterator[str] = itertools.cycle(decoders)
        self._mode = mode
        self._timeout = ClientTimeout(total=timeout_s)
        self._identities: dict[str, dict[str, Any] | None] = {}  # by prefill URL
        self._session: ClientSession | None = None
        self._background: set[asyncio.Task[None]] = set()

    async def start(self, app: web.Application) -> None:
        self._session = ClientSession(timeout=self._timeout)

    async def stop(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    def routes(self) -> list[web.RouteDef]:
        return [*(web.post(path, self.serve) for path in ENDPOINTS),
                web.get("/healthcheck", self.health)]

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def serve(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prefill, decode = next(self._prefillers), next(self._decoders)
        identity = await self._identity(prefill, request.path, body) \
            if self._mode == "push" else None
        if identity is not None:
            return await self._push(request, body, prefill, decode, identity)
        return await self._pull(request, body, prefill, decode)

    async def _pull(self, request: web.Request, body: dict[str, Any], prefill: str,
                    decode: str) -> web.StreamResponse:
        """vLLM's flow: prefill first, then decode with the prefill's params."""
        assert self._session is not None
        params = {DO_REMOTE_DECODE: True, DO_REMOTE_PREFILL: False}
        async with self._session.post(prefill + request.path,
                                      json=_prefill_body(body, params)) as answer:
            if answer.status != 200:
                return web.Response(status=answer.status, body=await answer.read(),
                                    content_type=answer.content_type)
            prefilled = await answer.json()
        decode_body = dict(body, kv_transfer_params=prefilled.get("kv_transfer_params"))
        return await self._relay(request, decode + request.path, decode_body)

    async def _push(self, request: web.Request, body: dict[str, Any], prefill: str,
                    decode: str, identity: dict[str, Any]) -> web.StreamResponse:
        """Both at once, one transfer key: the decode instance asks for the
        pushes as soon as it has blocks, the prefill instance pushes each layer."""
        transfer = uuid.uuid4().hex
        decode_params = dict(identity, **{DO_REMOTE_PREFILL: True, DO_REMOTE_DECODE: False,
                                          TRANSFER: transfer})
        prefill_params = {DO_REMOTE_DECODE: True, DO_REMOTE_PREFILL: False,
                          TRANSFER: transfer}
        task = asyncio.get_running_loop().create_task(
            self._prefill(prefill + request.path, _prefill_body(body, prefill_params)))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return await self._relay(request, decode + request.path,
                                 dict(body, kv_transfer_params=decode_params))

    async def _prefill(self, url: str, body: dict[str, Any]) -> None:
        """The prefill half of a push: its answer is only its success."""
        assert self._session is not None
        try:
            async with self._session.post(url, json=body) as answer:
                if answer.status != 200:
                    logger.warning("prefill at %s answered %d: %s", url, answer.status,
                                   (await answer.text())[:200])
        except (OSError, asyncio.TimeoutError) as exc:
            logger.warning("prefill at %s failed: %s", url, exc)

    async def _identity(self, prefill: str, path: str,
                        body: dict[str, Any]) -> dict[str, Any] | None:
        """The prefill instance's identity, from one probe (None: it does not push)."""
        if prefill in self._identities:
            return self._identities[prefill]
        assert self._session is not None
        probe = {"prompt": PROBE_PROMPT, "max_tokens": 1,
                 "kv_transfer_params": {DO_REMOTE_DECODE: True, PROBE: True}}
        if body.get("model"):
            probe["model"] = body["model"]
        try:
            async with self._session.post(prefill + "/v1/completions", json=probe) as answer:
                params = (await answer.json()).get("kv_transfer_params") \
                    if answer.status == 200 else None
        except (OSError, asyncio.TimeoutError, ValueError) as exc:
            logger.warning("probing %s failed: %s; vLLM's flow for now", prefill, exc)
            return None  # not remembered: asked again with the next request
        identity = params if params and params.get(MODE) == "push" else None
        if identity is None:
            logger.warning("the prefill instance at %s does not push (HixlConnector with "
                           "\"mode\": \"push\"?); its requests take vLLM's flow", prefill)
        self._identities[prefill] = identity
        return identity

    async def _relay(self, request: web.Request, url: str,
                     body: dict[str, Any]) -> web.StreamResponse:
        """Send the decode request and stream its answer back as it comes."""
        assert self._session is not None
        async with self._session.post(url, json=body) as answer:
            response = web.StreamResponse(status=answer.status)
            response.content_type = answer.content_type
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


def _urls(hosts: list[str], ports: list[int], what: str) -> list[str]:
    if len(hosts) != len(ports):
        raise SystemExit(f"{len(hosts)} {what} hosts but {len(ports)} ports")
    return [f"http://{host}:{port}" for host, port in zip(hosts, ports, strict=True)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hixl_client.vllm.proxy",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8192)
    parser.add_argument("--prefiller-hosts", nargs="+", default=["127.0.0.1"])
    parser.add_argument("--prefiller-ports", nargs="+", type=int, default=[8100])
    parser.add_argument("--decoder-hosts", nargs="+", default=["127.0.0.1"])
    parser.add_argument("--decoder-ports", nargs="+", type=int, default=[8200])
    parser.add_argument("--mode", choices=("pull", "push"), default="pull")
    parser.add_argument("--timeout-s", type=float, default=600.0,
                        help="bound on each request to an instance")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    proxy = Proxy(_urls(args.prefiller_hosts, args.prefiller_ports, "prefiller"),
                  _urls(args.decoder_hosts, args.decoder_ports, "decoder"), args.mode,
                  args.timeout_s)
    app = web.Application()
    app.add_routes(proxy.routes())
    app.on_startup.append(proxy.start)
    app.on_cleanup.append(proxy.stop)
    web.run_app(app, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
