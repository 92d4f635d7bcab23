"""``md_simulation`` on NumPy: a Lennard-Jones fluid that is deterministic, conserves energy, and continues
bit for bit from its own checkpoint (no CRIU; its runs through CRIU are in tests/criu/test_md_simulation.py)."""

from __future__ import annotations

import numpy as np
import pytest

from cutbench.workloads import api
from cutbench.workloads.common import load_state_file, state_bytes
from cutbench.workloads.md_simulation import LJSystem, MDSimulation


def params(**kw):
    return {**MDSimulation.defaults, "particles": 256, **kw}


def run(p, steps):
    sim = LJSystem(np, p)
    out = []
    for _ in range(steps):
        sim.launch()
        out.append(sim.effect(len(out) + 1))
    return sim, out


def test_two_runs_agree_bit_for_bit_and_another_seed_differs_at_every_step():
    _, a = run(params(), 15)
    _, b = run(params(), 15)
    _, c = run(params(seed=1), 15)
    assert a == b
    assert all(x != y for x, y in zip(a, c))


def test_velocity_verlet_conserves_the_total_energy():
    """The total energy wanders by less than 1% of the kinetic energy over 60 steps, and the wander shrinks
    as dt² when the step halves (the integrator's order: a force or energy wrong by a term would not)."""
    def wander(dt: float) -> tuple[float, float, int]:
        sim = LJSystem(np, params(dt=dt))
        energies, kinetic = [], []
        for _ in range(int(60 * 0.004 / dt)):
            sim.launch()
            energies.append(float(sim.pe) + float(sim.ke))
            kinetic.append(float(sim.ke))
        return max(energies) - min(energies), float(np.mean(kinetic)), sim.builds

    coarse, ke, builds = wander(0.004)
    fine, _, _ = wander(0.002)
    assert coarse / ke < 0.01, (coarse, ke)
    assert 2.5 < coarse / fine < 6.0, (coarse, fine)  # ≈ 4 for a second-order method
    assert builds > 1  # the displacement rule rebuilt the list along the way


def test_the_forces_from_the_list_are_the_forces_of_every_pair():
    """The neighbour list misses no pair within the cut-off: its forces equal a direct all-pairs sum."""
    sim = LJSystem(np, params(particles=128, density=0.6))
    for _ in range(10):
        sim.launch()
    x, box = sim.x, sim.box
    d = x[:, None, :] - x[None, :, :]
    d -= box * np.round(d / box)
    r2 = np.sum(d * d, axis=-1)
    np.fill_diagonal(r2, np.inf)
    inside = r2 < sim.rc2
    inv6 = np.where(inside, 1.0 / r2, 0.0) ** 3
    direct = np.sum((np.where(inside, 24.0 * (2 * inv6 * inv6 - inv6) / r2, 0.0))[:, :, None] * d, axis=1)
    assert np.allclose(sim.forces()[0], direct, rtol=1e-10, atol=1e-10)


def test_a_run_continued_from_its_saved_state_is_the_uninterrupted_run():
    sim, first = run(params(), 8)
    header, arrays = load_state_file_from(state_bytes({"committed": 8, "builds": sim.builds}, sim.arrays()))
    again = LJSystem(np, params())
    for name, buf in again.arrays().items():
        buf[...] = arrays[name]
    again.builds = header["builds"]
    rest = []
    for step in range(9, 16):
        again.launch()
        rest.append(again.effect(step))
    _, whole = run(params(), 15)
    assert first + rest == whole


def load_state_file_from(data: bytes):
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".npz") as fh:
        fh.write(data)
        fh.flush()
        return load_state_file(fh.name)


@pytest.mark.parametrize("bad, says", [
    ({"particles": 20}, "the box"),
    ({"density": 3.0}, "density = 3.0"),
    ({"dt": 0.5}, "dt = 0.5"),
    ({"max_neighbours": 2}, "max_neighbours"),
    ({"continue_from_cpt": True}, "needs cpt_every_ops > 0 or cpt_every_s > 0"),
    ({"max_wall_s": 60.0}, "needs continue_from_cpt = true"),
])
def test_parameters_out_of_range_are_named(bad, says):
    with pytest.raises(api.WorkloadError, match=says):
        api.resolve_params(api.load("md_simulation"), bad)


def test_too_many_neighbours_for_the_list_is_a_clear_error():
    with pytest.raises(ValueError, match="raise max_neighbours"):
        LJSystem(np, params(max_neighbours=8))


def test_its_ground_truth_is_recorded_and_its_checkpoint_file_is_on_disk():
    cls = api.load("md_simulation")
    assert api.records_reference(cls) and set(cls.arrays) == {"numpy", "cupy", "torch"}
    assert "disk" in api.declared_domains(cls, {**cls.defaults, "cpt_every_ops": 5})
    assert "disk" not in api.declared_domains(cls, dict(cls.defaults))
    assert "disk" in api.declared_domains(cls, {**cls.defaults, "cpt_every_s": 60.0})
