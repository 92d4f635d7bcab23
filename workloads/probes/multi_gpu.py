"""Probes that need two GPUs: peer access between them, a restore onto the other GPU (GPU migration,
``cuCheckpointProcessRestore`` with GPU pairs / the utility's ``--device-map``), and an NCCL job.

On a machine with one GPU their rows are skipped with that reason (``min_gpus = 2``): the code is here
so that a two-GPU machine measures them with the same command.
"""

from __future__ import annotations

from typing import Any, ClassVar

from cutbench.workloads.api import MatrixRow
from cutbench.workloads.nccl_ranks import NcclRanks
from cutbench.workloads.probes import Probe, launch_step
from cutbench.workloads.probes.memory import MemoryProbe


class PeerAccessProbe(Probe):
    """The workload ``probe_peer_access``: a buffer on each of two GPUs with peer access enabled; each op a kernel on
    GPU 0 steps its buffer, which is copied peer-to-peer onto GPU 1 and folded into GPU 1's buffer there."""

    name = "probe_peer_access"
    features = frozenset({"peer_access"})
    min_gpus: ClassVar[int] = 2
    defaults = {**Probe.defaults, "words": 1 << 16}
    matrix_rows = (MatrixRow("peer_access_two_gpus", "peer_access", "peer access between two GPUs, P2P copies every op"),)

    def open(self) -> None:
        """Both buffers; peer access both ways."""
        import cupy

        n = self.p["words"]
        self.devices = (0, 1)
        self.bufs = []
        for d in self.devices:
            with cupy.cuda.Device(d):
                other = 1 - d
                if cupy.cuda.runtime.deviceCanAccessPeer(d, other):
                    try:
                        cupy.cuda.runtime.deviceEnablePeerAccess(other)
                    except cupy.cuda.runtime.CUDARuntimeError:
                        pass  # already enabled
                self.bufs.append(cupy.arange(n, dtype=cupy.uint64) + cupy.uint64(self.p["seed"] + d))
                self.staging: Any = cupy.empty(n, dtype=cupy.uint64) if d == 1 else None

    def launch(self, op: int) -> None:
        """Step on GPU 0, copy to GPU 1, fold there."""
        import cupy

        with cupy.cuda.Device(0):
            launch_step(self.bufs[0], op)
            cupy.cuda.Device().synchronize()
        with cupy.cuda.Device(1):
            self.staging.data.copy_from_device(self.bufs[0].data, self.bufs[0].nbytes)
            self.bufs[1] ^= self.staging

    def wait(self, op: int) -> None:
        """Both GPUs done."""
        import cupy

        for d in self.devices:
            with cupy.cuda.Device(d):
                cupy.cuda.Device().synchronize()

    def buffers(self) -> dict[str, Any]:
        """Both buffers."""
        return {"gpu0": self.bufs[0], "gpu1": self.bufs[1]}

    def pointers(self) -> dict[str, int]:
        """Both addresses."""
        return {"gpu0": int(self.bufs[0].data.ptr), "gpu1": int(self.bufs[1].data.ptr)}


class MigrationProbe(MemoryProbe):
    """The workload ``probe_migration``: :class:`MemoryProbe` restored onto the other GPU (the row asks for
    ``restore_target = "other_gpu"``): the device memory must come back whole at its addresses there."""

    name = "probe_migration"
    arrays = ("cupy",)
    features = frozenset({"gpu_migration"})
    min_gpus: ClassVar[int] = 2
    matrix_rows = (MatrixRow("gpu_migration_other_gpu", "gpu_migration", "restore onto the other GPU of the machine",
                             {"size_bytes": 64 << 20}, restore_target="other_gpu"),)

    @classmethod
    def features_for(cls, params: dict[str, Any], array: str) -> frozenset[str]:
        """GPU migration (the device memory moves with it)."""
        return frozenset({"gpu_migration"})


class NcclProbe(NcclRanks):
    """The workload ``probe_nccl``: the ``nccl_ranks`` job (two ranks, an NCCL all-reduce every op) as a matrix row."""

    name = "probe_nccl"
    features: ClassVar[frozenset[str]] = frozenset({"nccl"})
    min_gpus: ClassVar[int] = 2
    matrix_rows: ClassVar[tuple[MatrixRow, ...]] = (
        MatrixRow("nccl_two_ranks", "nccl", "two ranks, one GPU each, an NCCL all-reduce every op",
                  {"world_size": 2}, cut_phase="device_done"),)
