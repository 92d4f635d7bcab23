"""``md_simulation``: a Lennard-Jones fluid integrated by velocity Verlet, with Verlet neighbour lists.

A real simulation code in miniature, the kind that checkpoints itself:
``particles`` atoms in a periodic cube at reduced density ``density``, the
12-6 potential cut at ``cutoff`` σ, velocity Verlet with step ``dt``, and a
neighbour list of every pair within ``cutoff + skin`` rebuilt when some atom
has moved more than half the skin since the last build (the usual
displacement rule, so when it rebuilds depends on the trajectory). Positions,
velocities, forces and the list live on the device (``rt.xp``); the list is
built on the host from a copy of the positions, as many codes do, and copied
back. Each op is one MD step; its effect carries the step's potential and
kinetic energy (their IEEE-754 bits) and a digest of the positions and
velocities after it.

Like GROMACS with ``-cpt``, it writes its own checkpoint (positions,
velocities, neighbour list and step) every ``cpt_every_ops`` steps, or once
``cpt_every_s`` seconds have passed since the last one (``-cpt``'s timer), to
``md.cpt`` in its trial directory (state on disk, domain ``disk``, outside
any process image), one record of fixed size rewritten in place; the ``app``
baseline saves and loads the same state (``save_state``/``load_state``).
With ``continue_from_cpt`` it also has GROMACS's restart path (``-cpi``): a
process started afresh that finds ``md.cpt`` continues after the step it
holds, so a requeue (the ``restart`` backend) recomputes only the steps since
the last checkpoint instead of every step. ``max_wall_s`` is GROMACS's
``-maxh``: once a run of the program has lasted that long, it writes its
checkpoint at the step it finished and stops, and the job is run again with
it, as a job script does (here in the same process, ``exec``, so the
harness's cuts keep following it: ``Runtime.start_again_in_place``).

Floating-point sums differ between NumPy, CuPy and PyTorch, so the ground
truth is recorded (``ground_truth = "recorded"``): two uninterrupted runs on
the machine and array backend, which must agree bit for bit. Every reduction
runs in a fixed order on one device (no atomics): the forces of an atom are
one sum over its neighbour slots.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from types import ModuleType
from typing import Any, ClassVar

from cutbench.files import overwrite_durably
from cutbench.workloads.common import (BaseWorkload, RecordedWorkload, check_range, load_state_into,
                                      save_state_file, state_bytes)
from cutbench.workloads.control import PHASES
from cutbench.workloads.xp import backend_name, pointer, synchronize, to_host

CPT_NAME = "md.cpt"


def lattice(n: int, box: float) -> Any:
    """Return ``n`` positions on the sites of the smallest simple cubic lattice that holds them (NumPy, float64)."""
    import numpy as np

    side = int(round(n ** (1.0 / 3.0)))
    while side ** 3 < n:
        side += 1
    grid = np.stack(np.meshgrid(*(np.arange(side),) * 3, indexing="ij"), axis=-1).reshape(-1, 3)[:n]
    return (grid + 0.5) * (box / side)


class LJSystem:
    """The state of the fluid and one velocity Verlet step (see module docstring)."""

    def __init__(self, xp: ModuleType, p: dict[str, Any]):
        import numpy as np

        self.xp, self.n = xp, p["particles"]
        self.box = (self.n / p["density"]) ** (1.0 / 3.0)
        self.dt, self.rc2 = p["dt"], p["cutoff"] ** 2
        self.u_rc = 4.0 * (p["cutoff"] ** -12 - p["cutoff"] ** -6)
        self.rl2 = (p["cutoff"] + p["skin"]) ** 2
        self.half_skin2 = (p["skin"] / 2.0) ** 2
        self.max_nb = p["max_neighbours"]
        rng = np.random.default_rng(p["seed"])
        v = rng.standard_normal((self.n, 3))
        v -= v.mean(axis=0)
        v *= np.sqrt(3.0 * self.n * p["temperature"] / np.sum(v * v))
        self.x = xp.asarray(lattice(self.n, self.box))
        self.v = xp.asarray(v)
        self.nb = xp.asarray(np.zeros((self.n, self.max_nb), dtype=np.int64))
        self.nb_mask = xp.asarray(np.zeros((self.n, self.max_nb), dtype=np.float64))
        self.x_built = xp.asarray(lattice(self.n, self.box))
        self.builds = 0
        self.build_list()
        self.f, self.pe = self.forces()
        self.ke = 0.0

    # -- the neighbour list ------------------------------------------------------
    def build_list(self) -> None:
        """Every pair within cutoff + skin, per atom in ascending index order, padded to ``max_neighbours``."""
        import numpy as np

        x = to_host(self.x)
        idx = np.zeros((self.n, self.max_nb), dtype=np.int64)
        mask = np.zeros((self.n, self.max_nb), dtype=np.float64)
        for start in range(0, self.n, 512):
            d = x[start:start + 512, None, :] - x[None, :, :]
            d -= self.box * np.round(d / self.box)
            r2 = np.sum(d * d, axis=-1)
            near = r2 < self.rl2
            near[np.arange(near.shape[0]), np.arange(start, start + near.shape[0])] = False
            counts = near.sum(axis=1)
            if counts.max(initial=0) > self.max_nb:
                raise ValueError(f"md_simulation: an atom has {int(counts.max())} neighbours within cutoff + skin, more "
                                 f"than max_neighbours = {self.max_nb}; raise max_neighbours or lower density")
            for row in range(near.shape[0]):
                js = np.flatnonzero(near[row])
                idx[start + row, :len(js)] = js
                idx[start + row, len(js):] = start + row  # padding: the atom itself, masked out
                mask[start + row, :len(js)] = 1.0
        xp = self.xp
        self.nb[...] = xp.asarray(idx)
        self.nb_mask[...] = xp.asarray(mask)
        self.x_built[...] = self.x
        self.builds += 1

    def list_stale(self) -> bool:
        """Whether some atom moved more than half the skin since the last build (the list may miss a pair)."""
        xp = self.xp
        d = self.x - self.x_built
        d = d - self.box * xp.round(d / self.box)
        return bool(float(xp.max(xp.sum(d * d, axis=1))) > self.half_skin2)

    # -- forces and one step -----------------------------------------------------
    def forces(self) -> tuple[Any, Any]:
        """Forces on every atom and the potential energy (a device scalar), from the neighbour list."""
        xp = self.xp
        flat = xp.reshape(self.nb, (-1,))
        xj = xp.reshape(xp.take(self.x, flat, axis=0), (self.n, self.max_nb, 3))
        d = self.x[:, None, :] - xj
        d = d - self.box * xp.round(d / self.box)
        r2 = xp.sum(d * d, axis=2)
        inside = (r2 < self.rc2) & (self.nb_mask > 0.5)
        safe = xp.where(inside, r2, xp.ones_like(r2))
        inv6 = (1.0 / safe) ** 3
        # F_ij = 24 (2 r^-12 - r^-6) / r^2 · d ; U = 4 (r^-12 - r^-6) - U(rc), shifted so that a pair crossing
        # the cut-off changes no energy; each pair counted from both ends.
        scale = xp.where(inside, 24.0 * (2.0 * inv6 * inv6 - inv6) / safe, xp.zeros_like(r2))
        f = xp.sum(scale[:, :, None] * d, axis=1)
        pe = 0.5 * xp.sum(xp.where(inside, 4.0 * (inv6 * inv6 - inv6) - self.u_rc, xp.zeros_like(r2)))
        return f, pe

    def launch(self) -> None:
        """Enqueue one velocity Verlet step (rebuilding the list first where it went stale)."""
        xp, dt = self.xp, self.dt
        self.v = self.v + 0.5 * dt * self.f
        self.x = self.x + dt * self.v
        self.x = self.x - self.box * xp.floor(self.x / self.box)
        if self.list_stale():
            self.build_list()
        self.f, self.pe = self.forces()
        self.v = self.v + 0.5 * dt * self.f
        self.ke = 0.5 * xp.sum(self.v * self.v)

    def state_digest(self) -> str:
        """Digest of the positions and velocities, bit for bit."""
        h = hashlib.blake2b(digest_size=16)
        for a in (self.x, self.v):
            h.update(to_host(a).tobytes())
        return h.hexdigest()

    def effect(self, step: int) -> str:
        """Step ``step``'s effect: its energies' bits and the state digest (reads the device back)."""
        bits = struct.unpack("<QQ", struct.pack("<dd", float(self.pe), float(self.ke)))
        return json.dumps({"step": step, "pe": f"{bits[0]:016x}", "ke": f"{bits[1]:016x}", "state": self.state_digest()})

    def arrays(self) -> dict[str, Any]:
        """The buffers a checkpoint of the simulation holds."""
        return {"x": self.x, "v": self.v, "f": self.f, "nb": self.nb, "nb_mask": self.nb_mask, "x_built": self.x_built}


class MDSimulation(RecordedWorkload):
    """The ``md_simulation`` workload (see module docstring)."""

    name: ClassVar[str] = "md_simulation"
    phases: ClassVar[tuple[str, ...]] = PHASES
    arrays: ClassVar[tuple[str, ...]] = ("numpy", "cupy", "torch")
    features: ClassVar[frozenset[str]] = frozenset({"device_memory"})
    defaults: ClassVar[dict[str, Any]] = {
        **BaseWorkload.COMMON_DEFAULTS, "ops": 40, "particles": 512, "density": 0.8, "temperature": 1.0, "dt": 0.004,
        "cutoff": 2.5, "skin": 0.3, "max_neighbours": 128, "cpt_every_ops": 0, "cpt_every_s": 0.0,
        "continue_from_cpt": False, "max_wall_s": 0.0,
    }

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """System size, density, time step, cut-off, skin, list width, checkpoint interval."""
        check_range("particles", p["particles"], 2, 1 << 20)
        for name, lo, hi in (("density", 0.01, 1.2), ("temperature", 0.01, 10.0), ("dt", 1e-5, 0.02),
                             ("cutoff", 1.0, 5.0), ("skin", 0.0, 1.0)):
            if not isinstance(p[name], (int, float)) or not lo <= float(p[name]) <= hi:
                raise ValueError(f"{name} = {p[name]!r}: expected a number in [{lo}, {hi}]")
        check_range("max_neighbours", p["max_neighbours"], 8, 4096)
        check_range("cpt_every_ops", p["cpt_every_ops"], 0, 1 << 30)
        check_range("cpt_every_s", p["cpt_every_s"], 0.0, 86_400.0)
        if p["continue_from_cpt"] and not (p["cpt_every_ops"] or p["cpt_every_s"]):
            raise ValueError("continue_from_cpt = true needs cpt_every_ops > 0 or cpt_every_s > 0: without its own "
                             "checkpoint there is nothing to continue from")
        check_range("max_wall_s", p["max_wall_s"], 0.0, 86_400.0)
        if p["max_wall_s"] and not p["continue_from_cpt"]:
            raise ValueError(f"max_wall_s = {p['max_wall_s']} needs continue_from_cpt = true: a run that stops at its "
                             "wall-time limit goes on only from its checkpoint")
        box = (p["particles"] / p["density"]) ** (1.0 / 3.0)
        if box < 2 * (p["cutoff"] + p["skin"]):
            raise ValueError(f"particles = {p['particles']} at density {p['density']}: the box ({box:.2f} σ) is narrower "
                             f"than twice cutoff + skin ({2 * (p['cutoff'] + p['skin']):.2f} σ); use more particles")

    @classmethod
    def domains_for(cls, params: dict[str, Any]) -> frozenset[str]:
        """Its own checkpoint file is state on disk."""
        own = int(params.get("cpt_every_ops") or 0) > 0 or float(params.get("cpt_every_s") or 0) > 0
        return frozenset({"disk"}) if own else frozenset()

    def setup(self) -> None:
        """Build the fluid on the device and its first neighbour list."""
        self.start_device()
        self.image_started = self.last_cpt = time.monotonic()  # the clocks of max_wall_s and cpt_every_s
        self.sim = LJSystem(self.xp, self.p)
        synchronize(self.xp)
        self.rt.mark_startup("model_build")
        self.pointers_initial = {"neighbours": pointer(self.sim.nb), "list_origin": pointer(self.sim.x_built)}

    def run_op(self, op: int) -> None:
        """One MD step through all seven phases; every ``cpt_every_ops`` steps or ``cpt_every_s`` seconds, its
        own checkpoint; at ``max_wall_s``, a checkpoint and a fresh start from it."""
        self.step_through(op, self.sim.launch, lambda: self.sim.effect(op))
        every = self.p["cpt_every_ops"]
        timer = self.p["cpt_every_s"]
        if (every and op % every == 0) or (timer and time.monotonic() - self.last_cpt >= timer):
            self.write_cpt(str(self.rt.workdir / CPT_NAME))
        ran = time.monotonic() - self.image_started
        if self.p["max_wall_s"] and ran >= self.p["max_wall_s"] and op < self.p["ops"]:
            # -maxh: checkpoint at this step and stop; the job is run again with the checkpoint (-cpi).
            self.write_cpt(str(self.rt.workdir / CPT_NAME))
            self.rt.start_again_in_place(f"step {op}: this run reached its wall-time limit "
                                         f"(max_wall_s = {self.p['max_wall_s']:g}, ran {ran:.2f} s)")

    def continue_from_own_checkpoint(self) -> int:
        """The simulation's restart path (GROMACS ``-cpi``), called in a process started afresh: with
        ``continue_from_cpt``, load ``md.cpt`` when the trial directory has one and return the step it holds
        (the run goes on after it); 0 to start from step 1."""
        path = self.rt.workdir / CPT_NAME
        if not self.p["continue_from_cpt"] or not path.exists():
            return 0
        return self._load(str(path))

    def write_cpt(self, path: str) -> None:
        """The simulation's own checkpoint: one fixed-size record written over the last in place, then fsync
        (never a second path: a cut inside the write leaves no renamed-away file for a restore to miss)."""
        overwrite_durably(path, state_bytes({"committed": self.committed, "builds": self.sim.builds}, self.sim.arrays()))
        self.last_cpt = time.monotonic()

    def report(self) -> dict[str, Any]:
        """Committed step, the state digest, energies of the last step, list builds and buffer addresses."""
        sim = self.sim
        return {
            **self.report_frame(sim.state_digest()),
            "builds": sim.builds,
            "backend": backend_name(self.xp),
            "pointers_initial": self.pointers_initial,
            "pointers_final": {"neighbours": pointer(sim.nb), "list_origin": pointer(sim.x_built)},
        }

    def save_state(self, path: str) -> None:
        """Application-level checkpoint at a step boundary (the ``app`` baseline): the arrays and the step."""
        save_state_file(path, {"committed": self.committed, "builds": self.sim.builds}, self.sim.arrays())

    def load_state(self, path: str) -> int:
        """Load :meth:`save_state`'s file into the buffers :meth:`setup` made; return the step to resume after."""
        return self._load(path)

    def _load(self, path: str) -> int:
        """Load a state file (:meth:`save_state`'s or ``md.cpt``, the same format) into the buffers :meth:`setup`
        made; return the step it holds."""
        sim = self.sim
        targets = sim.arrays()
        header = load_state_into(path, self.xp, targets)
        sim.builds = int(header["builds"])
        self.committed = int(header["committed"])
        return self.committed

