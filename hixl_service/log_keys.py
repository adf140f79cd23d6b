"""The correlation keys of the daemon's log records, and how a log call sets them.

A JSON log line (``logging.format = "json"``) carries ``request_id``,
``session``, ``cluster``, ``link`` and ``status`` as keys of their own when
the record has them, so that a log pipeline can select by them without
parsing messages. ``request_id`` comes from the request-id record factory
(``interceptors``) on every record; the others are given where they are
known, with ``extra=keys(...)``. Only the standard library: ``--check``
imports this.
"""

from __future__ import annotations

LOG_KEYS = ("request_id", "session", "cluster", "link", "status")


def link_name(local_cluster_id: int, remote_cluster_id: int) -> str:
    """A link's ``link`` key: the linking cluster, an arrow, the linked one."""
    return f"{local_cluster_id}->{remote_cluster_id}"


def keys(*, session: str | None = None, cluster: int | None = None,
         link: tuple[int, int] | None = None, status: str | None = None) -> dict[str, object]:
    """The ``extra`` of a log call: the keys given, none of the others."""
    extra: dict[str, object] = {}
    if session is not None:
        extra["session"] = session
    if cluster is not None:
        extra["cluster"] = cluster
    if link is not None:
        extra["link"] = link_name(*link)
    if status is not None:
        extra["status"] = status
    return extra
