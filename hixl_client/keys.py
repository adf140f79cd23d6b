"""Keys that name caches: by request/prefix, by cache id and batch slot, or by model (blocks).

The keys are immutable and compare and hash by value, so the daemon can use
them directly as dictionary keys.
"""

from __future__ import annotations

from typing import Any

from hixl_client._validation import check_int64, check_isinstance, check_uint32, check_uint64
from hixl_client.status import raise_if_false
from hixl_wire.types import PLACEHOLDER_ID

__all__ = [
    "PLACEHOLDER_ID",
    "BlocksCacheKey",
    "CacheKey",
    "CacheKeyByIdAndIndex",
    "check_cache_key",
]


_CLUSTER_SPELLINGS = ("prompt_cluster_id", "cluster_id")


def _collect(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    positional: tuple[str, ...],
    required: tuple[str, ...],
) -> dict[str, Any]:
    """Merge positional and keyword arguments the way LLM-DataDist's keys do.

    Positional values override keywords of the same name. The check order
    (count, cluster id, other required names, unknown names) is the reference's.
    """
    raise_if_false(len(args) + len(kwargs) <= len(positional), "Param num is over limit")
    merged = dict(kwargs)
    merged.update(zip(positional, args, strict=False))  # fewer args than names is normal
    raise_if_false(
        any(name in merged for name in _CLUSTER_SPELLINGS),
        "Param prompt_cluster_id or cluster_id is required",
    )
    for name in required:
        raise_if_false(name in merged, "Param {0} is required", name)
    valid = (*_CLUSTER_SPELLINGS, *positional)
    for name in merged:
        raise_if_false(name in valid, "Unsupported param:{0}", name)
    return merged


class CacheKey:
    """Names the batch slot of a continuous cache by request (or prefix) id.

    Accepts ``(cluster_id, req_id, model_id, prefix_id)`` positionally or by keyword;
    ``prompt_cluster_id`` is another spelling of ``cluster_id`` (``cluster_id`` wins if
    both are given).

    Args:
        *args: positional values, in the order above.
        **kwargs: keyword values; ``model_id`` defaults to 0 and ``prefix_id`` to
            `PLACEHOLDER_ID`.

    Raises:
        LLMException: more than 4 params, a missing cluster id or ``req_id``, or an
            unknown keyword (``LLM_PARAM_INVALID``).
        TypeError: an id is not an int.
        ValueError: an id is outside uint64.
    """

    __slots__ = ("_cluster_id", "_model_id", "_prefix_id", "_req_id")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        merged = _collect(
            args, kwargs, ("cluster_id", "req_id", "model_id", "prefix_id"), ("req_id",)
        )
        cluster_id = merged["cluster_id"] if "cluster_id" in merged else merged["prompt_cluster_id"]
        req_id = merged["req_id"]
        model_id = merged.get("model_id", 0)
        prefix_id = merged.get("prefix_id", PLACEHOLDER_ID)
        check_uint64("cluster_id", cluster_id)
        check_uint64("req_id", req_id)
        check_uint64("model_id", model_id)
        check_uint64("prefix_id", prefix_id)
        self._cluster_id: int = cluster_id
        self._req_id: int = req_id
        self._model_id: int = model_id
        self._prefix_id: int = prefix_id

    @property
    def cluster_id(self) -> int:
        """The cluster that owns the cache (used only to route remote pulls)."""
        return self._cluster_id

    @property
    def prompt_cluster_id(self) -> int:
        """Another name for `cluster_id`."""
        return self._cluster_id

    @property
    def req_id(self) -> int:
        """The request id (`PLACEHOLDER_ID` for an unused batch slot)."""
        return self._req_id

    @property
    def model_id(self) -> int:
        """The model id."""
        return self._model_id

    @property
    def prefix_id(self) -> int:
        """The prefix id (`PLACEHOLDER_ID` when the key is not a prefix key)."""
        return self._prefix_id

    def _ident(self) -> tuple[int, int, int, int]:
        return (self._cluster_id, self._req_id, self._model_id, self._prefix_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CacheKey):
            return NotImplemented
        return self._ident() == other._ident()

    def __hash__(self) -> int:
        return hash(self._ident())

    def __repr__(self) -> str:
        return (
            f"CacheKey(cluster_id={self._cluster_id}, req_id={self._req_id}, "
            f"prefix_id={self._prefix_id}, model_id={self._model_id})"
        )


class CacheKeyByIdAndIndex:
    """Names one batch slot of a remote cache by its cache id.

    Args:
        cluster_id: the remote cluster (uint64).
        cache_id: the remote cache id (int64).
        batch_index: the batch slot (uint32).

    Raises:
        TypeError: an argument is not an int.
        ValueError: an argument is out of range.
    """

    __slots__ = ("_batch_index", "_cache_id", "_cluster_id")

    def __init__(self, cluster_id: int, cache_id: int, batch_index: int = 0) -> None:
        check_uint64("cluster_id", cluster_id)
        check_int64("cache_id", cache_id)
        check_uint32("batch_index", batch_index)
        self._cluster_id = cluster_id
        self._cache_id = cache_id
        self._batch_index = batch_index

    @property
    def cluster_id(self) -> int:
        """The remote cluster."""
        return self._cluster_id

    @property
    def cache_id(self) -> int:
        """The remote cache id."""
        return self._cache_id

    @property
    def batch_index(self) -> int:
        """The batch slot."""
        return self._batch_index

    def _ident(self) -> tuple[int, int, int]:
        return (self._cluster_id, self._cache_id, self._batch_index)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CacheKeyByIdAndIndex):
            return NotImplemented
        return self._ident() == other._ident()

    def __hash__(self) -> int:
        return hash(self._ident())

    def __repr__(self) -> str:
        return (
            f"CacheKeyByIdAndIndex(cluster_id={self._cluster_id}, cache_id={self._cache_id}, "
            f"batch_index={self._batch_index})"
        )


class BlocksCacheKey:
    """Names a blocks (PagedAttention) cache by model id.

    Accepts ``(cluster_id, model_id)`` positionally or by keyword; ``prompt_cluster_id``
    is another spelling of ``cluster_id`` and is kept for the repr.

    Args:
        *args: positional values, in the order above.
        **kwargs: keyword values; ``model_id`` defaults to 0.

    Raises:
        LLMException: more than 2 params, a missing cluster id, or an unknown keyword
            (``LLM_PARAM_INVALID``).
        TypeError: an id is not an int (no range check, as in the reference).
    """

    __slots__ = ("_cluster_id", "_model_id", "_spelling")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not kwargs and 1 <= len(args) <= 2 and all(type(a) is int for a in args):
            # How engines build one per request, positionally: every check below passes.
            self._spelling = "cluster_id"
            self._cluster_id: int = args[0]
            self._model_id: int = args[1] if len(args) == 2 else 0
            return
        merged = _collect(args, kwargs, ("cluster_id", "model_id"), ())
        self._spelling = "cluster_id" if "cluster_id" in merged else "prompt_cluster_id"
        cluster_id = merged[self._spelling]
        model_id = merged.get("model_id", 0)
        check_isinstance(
            "cluster_id", cluster_id, int, extra_fmt="The first param ", allow_none=False
        )
        check_isinstance("model_id", model_id, int, extra_fmt="The second param ", allow_none=False)
        self._cluster_id = cluster_id
        self._model_id = model_id

    @property
    def cluster_id(self) -> int:
        """The cluster that owns the cache (ignored locally, names the remote on pull/push)."""
        return self._cluster_id

    @property
    def prompt_cluster_id(self) -> int:
        """Another name for `cluster_id`."""
        return self._cluster_id

    @property
    def model_id(self) -> int:
        """The model id."""
        return self._model_id

    def _ident(self) -> tuple[int, int]:
        return (self._cluster_id, self._model_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlocksCacheKey):
            return NotImplemented
        return self._ident() == other._ident()

    def __hash__(self) -> int:
        return hash(self._ident())

    def __repr__(self) -> str:
        return f"BlocksCacheKey({self._spelling}={self._cluster_id}, model_id={self._model_id})"


def check_cache_key(cache_key: CacheKey) -> None:
    """Check that exactly one of ``req_id`` and ``prefix_id`` is a real id.

    An id is real when ``0 <= id < PLACEHOLDER_ID``.

    Args:
        cache_key: the key to check.

    Raises:
        LLMException: both or neither are real (``LLM_PARAM_INVALID``).
    """
    req_valid = 0 <= cache_key.req_id < PLACEHOLDER_ID
    prefix_valid = 0 <= cache_key.prefix_id < PLACEHOLDER_ID
    raise_if_false(
        req_valid != prefix_valid,
        "exactly one of req_id and prefix_id must be a valid id, but got {0}.",
        cache_key,
    )
