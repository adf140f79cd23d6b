"""Device memory registered for one-sided HCCL transfers, and where it is bound.

HIXL's direct path, which hixl follows, registers memory once per process
(``HcclRegisterGlobalMem``) and binds it to each communicator that reaches it
(``HcclCommBindMem``) before that communicator is prepared
(``HcclCommPrepare``): preparing is when the peer learns which memory it may
read and write with ``HcclBatchGet`` / ``HcclBatchPut``. So:

* every device pool and every imported device buffer is registered when it
  is made, under the cluster it belongs to (`OneSidedMemory.register`);
* each side of a link binds its own cluster's memory to the link's
  communicator right after the communicator is built (`OneSidedMemory.bind`),
  and the link is then prepared; the `Binding` records what was bound, so
  that a transfer touching memory registered later knows that the link must
  be prepared again;
* releasing memory first tears down every communicator it is bound to
  (`Binding.teardown`: the channel's own destroy, which unbinds and then
  destroys the communicator), then deregisters it. Unbinding alone would
  not do: ``HcclCommUnbindMem`` only drops a record, and the peer keeps its
  mapping of the memory until the communicator is destroyed (hcomm
  ``hccl_one_sided_service.cc``: DeInit -> DisableMemAccess); HCCL refuses
  to deregister memory still bound and to destroy a communicator with
  memory bound, so the order is unbind, destroy, deregister, free.

Registration failing (a CANN without the one-sided API, or one refusing the
memory) is not an error: that memory then moves over the two-sided path. A
CANN may also export the entry points on a product that does not support
them: the first registration answered with HCCL_E_NOT_SUPPORT turns the
one-sided path off for the daemon, so that later links go two-sided at once.
Calls here block (HCCL); run them off the event loop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from hixl_native import _ascend
from hixl_native._ascend import AscendError

logger = logging.getLogger(__name__)

HCCL_E_NOT_SUPPORT = 5


class Binding:
    """The registered memories bound to one communicator, and how to tear that
    communicator down (set by its owner; blocking, idempotent)."""

    def __init__(self, comm: _ascend.HcclComm) -> None:
        self.comm = comm
        self.bound: dict[_ascend.DeviceMemory, _ascend.GlobalMemory] = {}
        self.teardown: Callable[[], None] | None = None

    def covers(self, memory: _ascend.DeviceMemory) -> bool:
        """Whether ``memory`` was bound before the communicator was prepared."""
        return memory in self.bound


class OneSidedMemory:
    """The daemon's registered device memory (one per process, as HCCL's registry is)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._registered: dict[_ascend.DeviceMemory, tuple[_ascend.GlobalMemory, int]] = {}
        self._bindings: set[Binding] = set()

    def register(self, memory: _ascend.DeviceMemory, cluster_id: int) -> None:
        """Register a cluster's device memory for one-sided access (best effort)."""
        if not self.enabled:
            return
        try:
            registered = _ascend.GlobalMemory(memory)
        except AscendError as exc:
            if exc.code == HCCL_E_NOT_SUPPORT:
                self.enabled = False
                logger.warning("HCCL does not support its one-sided API here (%s); HCCL "
                               "links go two-sided", exc)
            else:
                logger.warning("device memory of cluster %d is not registered for one-sided "
                               "transfers (they fall back to two-sided): %s", cluster_id, exc)
            return
        with self._lock:
            self._registered[memory] = (registered, cluster_id)

    def release(self, memory: _ascend.DeviceMemory) -> None:
        """Tear down every communicator ``memory`` is bound to, then deregister it; it
        may then be freed (blocking)."""
        with self._lock:
            found = self._registered.pop(memory, None)
            if found is None:
                return
            holding = [b for b in self._bindings if memory in b.bound]
        for binding in holding:
            if binding.teardown is not None:
                binding.teardown()  # unbinds what it holds, destroys the communicator
            else:  # nobody owns the communicator: leave it unbound at least
                self.unbind(binding)
        _quietly(found[0].release)

    def bind(self, comm: _ascend.HcclComm, cluster_id: int) -> Binding:
        """Bind every registered memory of ``cluster_id`` on the communicator's device.

        Raises:
            AscendError: HCCL refused a binding (those made are undone).
        """
        binding = Binding(comm)
        with self._lock:
            try:
                for memory, (registered, owner) in self._registered.items():
                    if owner == cluster_id and memory.device is comm.device:
                        _ascend.hccl_bind(comm, registered)
                        binding.bound[memory] = registered
            except BaseException:
                for registered in binding.bound.values():
                    _quietly(_ascend.hccl_unbind, comm, registered)
                raise
            self._bindings.add(binding)
        return binding

    def unbind(self, binding: Binding) -> None:
        """Unbind what ``binding`` holds (before its communicator is destroyed)."""
        with self._lock:
            self._bindings.discard(binding)
            for registered in binding.bound.values():
                _quietly(_ascend.hccl_unbind, binding.comm, registered)
            binding.bound.clear()


def _quietly(call: Callable[..., object], *args: object) -> None:
    """Tear-down calls: a failure is logged, never raised (the memory goes anyway)."""
    try:
        call(*args)
    except (AscendError, ValueError) as exc:
        logger.info("releasing one-sided HCCL memory: %s", exc)
