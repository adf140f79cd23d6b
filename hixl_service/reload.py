"""What SIGHUP reloads: the settings a running daemon can take without a restart.

On SIGHUP the daemon reads its configuration again (the same file, and the
environment it was started with) and compares it with the one it runs:

* the log level (``logging.level``), the ``[limits]`` on peers except
  ``max_data_connections``, the allow-list ``security.allowed_peers`` and
  ``transfer.checksum`` take effect at once; a changed allow-list or limit
  applies to the links made from then on, links already made stay; the
  checksum default applies to the transfer calls made from then on (a
  repeat keeps the choice of the call it repeats);
* every other changed field is logged as needing a restart, and keeps its
  running value: listeners, pools, credentials and the security mode are
  bound when the daemon starts, and changing them under live sessions would
  pull memory or sockets from under clients.

A configuration that does not load (bad TOML, an invalid value) changes
nothing: the error is logged and the daemon keeps serving as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .config import DaemonConfig
from .trust import Trust

if TYPE_CHECKING:
    from .engine import EngineDeps

__all__ = ["RELOADABLE", "ReloadPlan", "apply_reload", "plan_reload"]

logger = logging.getLogger(__name__)

# section -> the fields SIGHUP applies; the native data server sizes its
# connection table at start, so limits.max_data_connections is not one.
RELOADABLE: Mapping[str, frozenset[str]] = {
    "logging": frozenset({"level"}),
    "limits": frozenset({"max_inbound_links", "max_links_per_peer", "hello_rate",
                         "hello_burst"}),
    "security": frozenset({"allowed_peers"}),
    "transfer": frozenset({"checksum"}),
}


@dataclass(frozen=True)
class ReloadPlan:
    """The outcome of comparing the running configuration with the one just loaded.

    Attributes:
        config: The configuration in force after the reload: the running one
            with the reloadable fields taken from the loaded one.
        applied: ``section.field`` of each reloadable field that changed.
        need_restart: ``section.field`` of each other field that changed.
    """

    config: DaemonConfig
    applied: tuple[str, ...]
    need_restart: tuple[str, ...]


def plan_reload(running: DaemonConfig, loaded: DaemonConfig) -> ReloadPlan:
    """Compare field by field; nothing is applied yet."""
    applied: list[str] = []
    need_restart: list[str] = []
    sections: dict[str, object] = {}
    for section in type(running).model_fields:
        old, new = getattr(running, section), getattr(loaded, section)
        taken: dict[str, object] = {}
        for field in type(old).model_fields:
            before, after = getattr(old, field), getattr(new, field)
            if before == after:
                continue
            if field in RELOADABLE.get(section, ()):
                applied.append(f"{section}.{field} {_shown(before)} -> {_shown(after)}")
                taken[field] = after
            else:
                need_restart.append(f"{section}.{field}")
        if taken:
            sections[section] = old.model_copy(update=taken)
    return ReloadPlan(running.model_copy(update=sections), tuple(applied), tuple(need_restart))


def _shown(value: object) -> str:
    if isinstance(value, list):  # allowed_peers: identities, not whole entries
        return f"[{len(value)} entries]"
    return str(value)


def apply_reload(plan: ReloadPlan, trust: Trust, deps: EngineDeps) -> None:
    """Put the plan's reloadable settings in force, and log what changed and what did not.

    The report is logged at the more verbose of the old and the new log
    level, so that lowering or raising the level is itself reported.
    """
    config = plan.config
    trust.update(config.security.allowed_peers, config.limits)
    deps.checksum = config.transfer.checksum
    root = logging.getLogger()
    level = logging.getLevelName(config.logging.level)
    if level >= root.level:
        _report(plan)
        root.setLevel(level)
    else:
        root.setLevel(level)
        _report(plan)


def _report(plan: ReloadPlan) -> None:
    if plan.applied:
        logger.info("reloaded: %s", "; ".join(plan.applied))
    if plan.need_restart:
        logger.warning("changed but not reloaded (a restart applies them; the running values "
                       "stay): %s", ", ".join(plan.need_restart))
    if not plan.applied and not plan.need_restart:
        logger.info("reloaded: nothing changed")
