"""The one place that turns ``pool.backend`` into the parts built on it.

:func:`open_backend` returns what the engine's memory, copies and links are
built from, whichever backend the configuration names:

* ``host``: memfd pools within ``pool.max_bytes`` for HOST and DEVICE alike
  (``memory.host``), native memcpy copies, engine-allocated client memory
  (``memory.process``), links over TCP;
* ``hccl``: CANN and the configured devices opened first
  (``ascend.backend``, off the loop), DEVICE pools of device memory
  (``memory.device``), HOST pools and buffers page-locked for ACL copies
  (so no engine-allocated client memory), copies through ACL where device
  memory is involved (its ``copy_job``), links over HCCL.

Links inside one daemon copy locally on both. The server builds the engine
from the :class:`Backend` without asking which one it got.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import hixl_native

from .ascend.backend import AscendBackend
from .ascend.comms import host_address
from .copier import Copier
from .memory.device import DeviceBackend
from .memory.host import HostBackend, Unpinnable
from .memory.process import ProcessBackend, cross_memory_policy
from .pools import PoolManager
from .transports.factory import TransportKit

if TYPE_CHECKING:
    from .completions import CompletionDispatcher
    from .config import DaemonConfig

logger = logging.getLogger(__name__)

PinHost = Callable[[hixl_native.Mapping], Unpinnable | None]


@dataclass(frozen=True)
class Backend:
    """The parts of one ``pool.backend`` that the engine is built from."""

    name: str  # pool.backend: "host" or "hccl", as Admin and the peers' Hello report it
    pools: PoolManager
    copier: Copier
    kit: TransportKit  # what the links' transports are built from (the copier's too)
    # Engine-allocated client memory: what the kernel lets this daemon reach.
    process: ProcessBackend
    ascend: AscendBackend | None = None  # hccl: CANN and the devices this daemon serves


async def open_backend(config: DaemonConfig, dispatcher: CompletionDispatcher,
                       advertise_host: str) -> Backend:
    """Open the backend ``config.pool.backend`` names, with its copier's threads
    posting to ``dispatcher``; the caller closes the copier.

    Args:
        config: The daemon's configuration (``[pool]``, ``[transfer]``, ``[ascend]``).
        dispatcher: Where native copies and transfers report their completions.
        advertise_host: This daemon's address for peers, which names the host in
            HCCL's rank tables unless ``ascend.if_ip`` does.

    Raises:
        BackendUnavailable: ``hccl`` was asked for and CANN or a device cannot be
            opened (the process exits 2): never a silent fallback to host memory.
    """
    ascend: AscendBackend | None = None
    transfer = config.transfer
    cross_memory = cross_memory_policy()
    if config.pool.backend == "hccl":
        ascend = await asyncio.to_thread(AscendBackend.open, config.ascend,
                                         host_address(advertise_host))
        pools = PoolManager(_host_backend(config, ascend.pin_host), DeviceBackend(ascend))
    else:
        logger.info("engine-allocated client memory: %s", cross_memory.summary())
        pools = PoolManager(_host_backend(config))
    process = ProcessBackend(cross_memory, transfer.bounce_buffers,
                             int(transfer.bounce_buffer_bytes), page_locked=ascend is not None)
    copier = Copier(transfer.copy_threads, dispatcher)
    kit = TransportKit(copier, dispatcher, ascend, transfer.streams_per_link,
                       transfer.connect_timeout_s)
    return Backend(config.pool.backend, pools, copier, kit, process, ascend)


def _host_backend(config: DaemonConfig, pin: PinHost | None = None) -> HostBackend:
    """HOST pools (and DEVICE pools too, on the host backend) and clients' shareable
    buffers, each page-locked by ``pin`` (the hccl backend's, for ACL copies)."""
    return HostBackend(int(config.pool.max_bytes), config.pool.populate, pin)
