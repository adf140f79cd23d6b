"""The Ascend backend of the daemon: CANN loaded once, device pools, ACL copies.

With ``pool.backend = "hccl"`` the daemon loads CANN at start (from
``ascend.cann_path`` or the CANN environment) and opens every configured
device; any failure stops the start with "HCCL backend unavailable: <reason>"
rather than falling back to host memory. DEVICE pools are then ``aclrtMalloc``
memory (2 MiB aligned, huge pages) carved by an offset-only extent allocator
and exported to each attached client with ACL IPC, and registered for
one-sided HCCL transfers (``onesided.OneSidedMemory``) where CANN has the API;
HOST pools and host buffers are page-locked with ``aclrtHostRegisterV2``
(`pin_host`). Copies that touch device memory are ``aclrtMemcpyAsync``
batches on a fresh stream, synchronized with a bound, in the daemon's copy
executor, and every range of them must be 64-byte aligned.
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import hixl_native
import numpy as np
from hixl_native import _ascend
from hixl_native._ascend import AscendError, AscendUnavailable

from hixl_wire.status import LLMException, LLMStatusCode

from ..native_errors import to_llm_exception
from . import comms
from .comms import CommSettings, RankInfo
from .onesided import OneSidedMemory

if TYPE_CHECKING:
    from ..config import AscendConfig
    from ..memory.base import Memory, Pool
    from ..planning import Ranges

logger = logging.getLogger(__name__)

# aclrtMemcpyAsync: "the source address and destination address must be
# 64-byte aligned" (CANN 8.0 runtime API reference, aclrtMemcpyAsync,
# restrictions for all models).
COPY_ALIGNMENT = 64
# A copy inside the daemon has no caller deadline (LLM-DataDist's copies have
# none); this bounds it all the same, so a wedged device cannot hang a request.
COPY_TIMEOUT_MS = 60_000


class BackendUnavailable(Exception):
    """The configured Ascend backend cannot start; the message says why."""


@dataclass
class _DeviceBudget:
    device: _ascend.Device
    budget: int
    reserved: int = 0        # pools and communicator buffers together
    comm_bytes: int = 0      # of which communicator buffers
    communicators: int = 0


@dataclass(frozen=True)
class DeviceUse:
    """One device's budget as the admin status shows it."""

    device_id: int
    budget_bytes: int
    reserved_bytes: int
    hccl_buffer_bytes: int
    communicators: int


class AscendBackend:
    """CANN and the devices this daemon serves."""

    def __init__(self, runtime: _ascend.AscendRuntime, devices: dict[int, _ascend.Device],
                 device_budget: int, config: AscendConfig | None = None,
                 host_ip: str = "127.0.0.1") -> None:
        self.runtime = runtime
        self._devices = {i: _DeviceBudget(d, device_budget) for i, d in devices.items()}
        # communicators are built and destroyed on worker threads
        self._budget_lock = threading.Lock()
        self.tgid = runtime.bare_tgid()
        # Device memory registered for one-sided HCCL, where the loaded CANN has the API.
        self.one_sided = OneSidedMemory(_ascend.one_sided_supported())
        self._host_ip = host_ip
        self._device_ips = dict(config.device_ips) if config is not None else {}
        self._hccn = comms.hccn_addresses()
        self._soc: str | None = None  # read once, on first use
        self.comm_settings = CommSettings(
            mode=config.comm_init if config is not None else "root_info",
            buffer_mb=config.hccl_buffer_mb if config is not None else 200,
            describe=self.rank_info, reserve=self.reserve_device_bytes,
            release=self.release_device_bytes)

    @classmethod
    def open(cls, config: AscendConfig, host_ip: str = "127.0.0.1") -> AscendBackend:
        """Load CANN and open the configured devices (blocking: run it off the loop).

        HCCL's network settings of ``[ascend]`` are checked and exported first
        (HCCL reads them from the environment).

        Args:
            config: The ``[ascend]`` section.
            host_ip: This host in rank tables (``server_id``) when ``ascend.if_ip``
                is unset.

        Raises:
            BackendUnavailable: CANN is missing or broken, lacks what
                ``ascend.comm_init`` needs, a network setting does not fit this
                host, or a device cannot be opened.
        """
        try:
            comms.check_network(config)
        except ValueError as exc:
            raise BackendUnavailable(f"HCCL backend unavailable: {exc}") from None
        exported = comms.apply_environment(config)
        path = config.cann_path
        try:
            runtime = _ascend.load(path)
        except AscendUnavailable as exc:
            raise BackendUnavailable(str(exc)) from None
        if config.comm_init == "rank_table" and "rank_table" not in runtime.features:
            raise BackendUnavailable(
                "HCCL backend unavailable: this CANN's libhccl.so lacks "
                "HcclCommInitClusterInfoMemConfig (ascend.comm_init = \"rank_table\"); set "
                "ascend.comm_init = \"root_info\" where the product supports root info")
        try:
            count = runtime.device_count()
            missing = [d for d in config.devices if d >= count]
            if missing:
                raise BackendUnavailable(
                    f"HCCL backend unavailable: ascend.devices names device(s) {missing}, but "
                    f"this host has {count} (ids 0..{count - 1})")
            devices = {d: runtime.set_device(d) for d in config.devices}
        except AscendError as exc:
            raise BackendUnavailable(
                f"HCCL backend unavailable: {to_llm_exception(exc, 'opening the devices')}"
            ) from None
        backend = cls(runtime, devices, int(config.device_pool_max_bytes), config,
                      config.if_ip or host_ip)
        logger.info("Ascend backend: CANN from %s, devices %s, communicators by %s, HCCL "
                    "links %s, HCCL %s", os.path.dirname(runtime.paths[0]), sorted(devices),
                    config.comm_init,
                    "one-sided where both ends can" if backend.one_sided.enabled
                    else "two-sided (this CANN lacks the one-sided API)",
                    " ".join(f"{k}={v}" for k, v in sorted(exported.items())))
        return backend

    @property
    def cann_dir(self) -> str:
        """The directory CANN's libraries were loaded from (clients load the same)."""
        return os.path.dirname(self.runtime.paths[0])

    @property
    def device_ids(self) -> list[int]:
        return sorted(self._devices)

    def device(self, device_id: int) -> _ascend.Device:
        """The opened device, or LLM_PARAM_INVALID for one this daemon does not serve."""
        state = self._devices.get(device_id)
        if state is None:
            raise LLMException(f"device {device_id} is not served by this daemon "
                               f"(ascend.devices = {self.device_ids})",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        return state.device

    # -- communicators -----------------------------------------------------------------

    def rank_info(self, device_id: int) -> RankInfo:
        """This daemon's rank on a device, as a rank table names it."""
        device = self.device(device_id)
        physical = _ascend.physical_device_id(device)
        ip = self._device_ips.get(device_id) or self._hccn.get(physical, "")
        soc = self.soc
        super_device_id = super_pod_id = None
        if soc.startswith(comms.A3_SOC_PREFIX):
            # HIXL's rank_table_generator_v2.cc reads both with the logical id
            try:
                super_device_id, super_pod_id = _ascend.super_pod_ids(device)
            except AscendError as exc:
                logger.warning("device %d (%s): no super-pod ids, its rank tables stay at "
                               "version 1.0: %s", device_id, soc, to_llm_exception(exc))
        return RankInfo(self._host_ip, physical, ip, soc, super_device_id, super_pod_id)

    @property
    def soc(self) -> str:
        """The SoC's name (``aclrtGetSocName``), "" where CANN cannot tell."""
        if self._soc is None:
            self._soc = _ascend.soc_name() or ""
        return self._soc

    def reserve_device_bytes(self, device_id: int, nbytes: int) -> None:
        """Count a communicator's buffers against the device's budget.

        Raises:
            LLMException: LLM_DEVICE_OUT_OF_MEMORY when they do not fit.
        """
        self.device(device_id)
        with self._budget_lock:
            state = self._devices[device_id]
            if state.reserved + nbytes > state.budget:
                raise LLMException(
                    f"an HCCL communicator's {nbytes}-byte buffers exceed device {device_id}'s "
                    f"budget ({state.budget - state.reserved} of {state.budget} bytes left; see "
                    f"ascend.device_pool_max_bytes and ascend.hccl_buffer_mb)",
                    status_code=LLMStatusCode.LLM_DEVICE_OUT_OF_MEMORY)
            state.reserved += nbytes
            state.comm_bytes += nbytes
            state.communicators += 1

    def release_device_bytes(self, device_id: int, nbytes: int) -> None:
        with self._budget_lock:
            state = self._devices[device_id]
            state.reserved -= nbytes
            state.comm_bytes -= nbytes
            state.communicators -= 1

    def device_use(self) -> list[DeviceUse]:
        """Each device's budget, pools and communicator buffers (admin status)."""
        with self._budget_lock:
            return [DeviceUse(i, s.budget, s.reserved, s.comm_bytes, s.communicators)
                    for i, s in sorted(self._devices.items())]

    # -- device pools ---------------------------------------------------------------

    async def create_pool(self, device_id: int, memory_size: int, page_shift: int,
                          cluster_id: int = 0) -> tuple[_ascend.DeviceBuffer,
                                                        hixl_native.ExtentAllocator]:
        """Allocate, export and register a pool's device memory within the device's budget."""
        device = self.device(device_id)
        state = self._devices[device_id]
        unit = max(1 << page_shift, _ascend.DEVICE_ALIGNMENT)
        size = -(-memory_size // unit) * unit
        with self._budget_lock:
            if state.reserved + size > state.budget:
                raise LLMException(
                    f"a {size}-byte pool exceeds device {device_id}'s pool budget "
                    f"({state.budget - state.reserved} of {state.budget} bytes left; see "
                    f"ascend.device_pool_max_bytes)",
                    status_code=LLMStatusCode.LLM_DEVICE_OUT_OF_MEMORY)
            state.reserved += size
        try:
            buffer = await asyncio.to_thread(_allocate_exported, device, size)
        except BaseException:
            with self._budget_lock:
                state.reserved -= size
            raise
        await asyncio.to_thread(self.one_sided.register, buffer, cluster_id)
        return buffer, hixl_native.ExtentAllocator(size, page_shift)

    async def release_pool(self, pool: Pool) -> None:
        """Withdraw a pool's export and free its device memory."""
        buffer = pool.device_buffer
        assert buffer is not None
        try:
            await asyncio.to_thread(self.one_sided.release, buffer)
            await asyncio.to_thread(_free_exported, buffer)
        except AscendError as exc:
            logger.warning("freeing pool %d: %s", pool.pool_id, to_llm_exception(exc))
        finally:
            with self._budget_lock:
                self._devices[buffer.device.id].reserved -= buffer.size

    @staticmethod
    def share(pool: Pool, tgid: int) -> str:
        """Let a client process import a pool; return its export key."""
        buffer = pool.device_buffer
        assert buffer is not None
        try:
            buffer.allow_import([tgid])
        except (AscendError, ValueError) as exc:
            if isinstance(exc, AscendError):
                raise to_llm_exception(exc, f"sharing pool {pool.pool_id}") from exc
            raise LLMException(f"cannot share pool {pool.pool_id} with process {tgid}: {exc}",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID) from None
        key = buffer.key
        assert key is not None
        return key

    async def import_buffer(self, device_id: int, key: str, size: int,
                            cluster_id: int = 0) -> _ascend.ImportedBuffer:
        """Import device memory a client exported for this daemon (registered caches) and
        register it for one-sided HCCL; `forget` undoes the registration."""
        device = self.device(device_id)
        if size <= 0:
            raise LLMException(f"a device buffer of {size} bytes",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        try:
            imported = await asyncio.to_thread(device.import_ipc, key, size)
        except AscendError as exc:
            raise to_llm_exception(exc, "importing the client's device buffer") from exc
        except ValueError as exc:
            raise LLMException(f"importing the client's device buffer: {exc}",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID) from None
        await asyncio.to_thread(self.one_sided.register, imported, cluster_id)
        return imported

    def forget(self, memory: _ascend.DeviceMemory) -> None:
        """Unbind and deregister device memory before it is freed (blocking)."""
        self.one_sided.release(memory)

    def pin_host(self, mapping: hixl_native.Mapping) -> _ascend.PinnedHost | None:
        """Page-lock host memory for ACL copies (``aclrtHostRegisterV2`` with
        ``ACL_HOST_REG_PINNED``; blocking).

        Returns None where CANN lacks aclrtHostRegisterV2 (``aclrtHostRegister``
        maps memory without locking it, so it is not used), or refuses it
        (logged): the memory then stays unlocked, which CANN copies
        synchronously.

        Raises:
            LLMException: LLM_FEATURE_NOT_ENABLED on a kernel up to 5.10, where
                CANN mishandles registered memory not from aclrtMallocHost
                ("aclrtHostRegisterV2"), which hixl's memfd mappings are not.
        """
        check_host_kernel(platform.release())
        if not _ascend.host_register_supported():
            return None
        device = self._devices[self.device_ids[0]].device
        try:
            return _ascend.PinnedHost(device, mapping)
        except (AscendError, ValueError) as exc:
            logger.warning("host memory of %d bytes stays unlocked (aclrtHostRegisterV2 "
                           "refused it): %s", mapping.size, exc)
            return None

    # -- copies -------------------------------------------------------------------------

    def copy_job(self, dst: Memory, src: Memory, triples: Ranges,
                 timeout_ms: int = COPY_TIMEOUT_MS) -> _CopyJob:
        """Prepare a copy of (dst offset, src offset, length) triples touching device memory."""
        side = dst.device if dst.device is not None else src.device
        assert side is not None
        if dst.device is not None and src.device is not None and (
                dst.device.device.id != src.device.device.id):
            raise LLMException(
                f"copies between devices {src.device.device.id} and {dst.device.device.id} "
                f"are not supported; stage them through a HOST pool",
                status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
        device = side.device
        _check_aligned(dst, src, triples)
        return _CopyJob(device, _operand(device, dst), _operand(device, src), triples, timeout_ms)


def check_host_kernel(release: str) -> None:
    """Refuse host memory for ACL on kernels up to 5.10.

    CANN's "aclrtHostRegisterV2" page: on those kernels, memory not from
    aclrtMallocHost "causes an anomaly" (it is not refused); hixl's HOST pools
    and host buffers are memfd mappings shared with clients, so they cannot
    come from aclrtMallocHost.

    Raises:
        LLMException: LLM_FEATURE_NOT_ENABLED, naming the kernel.
    """
    parts = release.split(".")
    try:
        version = (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0))
    except (IndexError, ValueError):
        return  # not a Linux release string: nothing known to refuse
    if version <= (5, 10):
        raise LLMException(
            f"host memory on the hccl backend needs a kernel above 5.10 (this host runs "
            f"{release}): CANN mishandles registered host memory not from aclrtMallocHost "
            f"there, and hixl's HOST pools and host buffers are shared mappings; use DEVICE "
            f"caches only on this host, or upgrade its kernel",
            status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)


def _check_aligned(dst: Memory, src: Memory, triples: Ranges) -> None:
    """Refuse, before anything is queued, ranges ACL cannot copy asynchronously."""
    rows = np.asarray(triples, dtype=np.uint64).reshape(-1, 3)  # the copier passes them flat
    moving = rows[rows[:, 2] > 0]
    for memory, column, what in ((dst, 0, "destination"), (src, 1, "source")):
        base = memory.device.address if memory.device is not None else memory.native.address
        starts = moving[:, column] + np.uint64(base % COPY_ALIGNMENT)
        bad = np.flatnonzero(starts % np.uint64(COPY_ALIGNMENT))
        if bad.size:
            row = moving[bad[0]]
            raise LLMException(
                f"the {what} range at offset {int(row[column])} ({int(row[2])} bytes) is not "
                f"{COPY_ALIGNMENT}-byte aligned; ACL copies need aligned addresses, so block "
                f"and tensor sizes of caches copied on an Ascend host must be multiples of "
                f"{COPY_ALIGNMENT} bytes", status_code=LLMStatusCode.LLM_PARAM_INVALID)


def _operand(device: _ascend.Device, memory: Memory) -> _ascend.DeviceMemory | _ascend.HostRegion:
    """The shim object of a memory: device memory as is, host memory as a region."""
    if memory.device is not None:
        return memory.device
    mapping = memory.native
    return _ascend.HostRegion(device, mapping, mapping.address, mapping.size)


@dataclass
class _CopyJob:
    """One batch of ACL copies, run in a worker thread; raises LLMException on failure."""

    device: _ascend.Device
    dst: _ascend.DeviceMemory | _ascend.HostRegion
    src: _ascend.DeviceMemory | _ascend.HostRegion
    triples: Ranges
    timeout_ms: int

    def __call__(self) -> None:
        try:
            with self.device.create_stream() as stream:
                stream.memcpy_ranges(self.dst, self.src, self.triples)
                stream.synchronize(self.timeout_ms)
        except AscendError as exc:
            raise to_llm_exception(exc, "copying") from exc
        except ValueError as exc:
            raise LLMException(f"copying: {exc}",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID) from None
        finally:
            for operand in (self.dst, self.src):
                if isinstance(operand, _ascend.HostRegion):
                    operand.close()


def _allocate_exported(device: _ascend.Device, size: int) -> _ascend.DeviceBuffer:
    try:
        buffer = device.malloc(size, huge_only=True)
    except AscendError as exc:
        raise to_llm_exception(exc, f"allocating a {size}-byte pool on device {device.id}") \
            from exc
    try:
        buffer.export_key(pid_validation=True)
    except AscendError as exc:
        buffer.close()
        raise to_llm_exception(exc, "exporting a pool") from exc
    return buffer


def _free_exported(buffer: _ascend.DeviceBuffer) -> None:
    try:
        buffer.unexport()
    finally:
        buffer.close()
