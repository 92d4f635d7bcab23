"""``torch_training`` on NumPy, in process: a deterministic training run whose hand-written gradient is the
loss's, whose loss goes down, whose batches do not depend on the loader's workers, and which continues bit for
bit from its own checkpoint (no CRIU; its runs through CRIU are in tests/criu/test_torch_training.py)."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cutbench.procs import is_zombie_or_gone
from cutbench.workloads import api
from cutbench.workloads.data_loader import Loader, corpus
from cutbench.workloads.torch_training import CPT_NAME, TorchTraining, Trainer, Transformer
from tests.conftest import REPO


def params(**kw):
    return {**TorchTraining.defaults, "loader_workers": 0, **kw}


# Small epochs (6 micro-batches, 3 steps) so that a dozen steps cross several reshuffles.
SHORT = {"corpus_sequences": 24, "batch_size": 4, "seq_len": 16, "d_model": 16, "heads": 2}


def train(p, steps):
    """``steps`` optimizer steps (run_op without its cut points); returns the effects, the final state digest."""
    loader = Loader(p)
    try:
        trainer = Trainer(np, p, loader)
        out = []
        for _ in range(steps):
            trainer.launch()
            out.append(trainer.effect())
        return out, trainer.state_digest()
    finally:
        loader.close()


def losses(effects):
    return [struct.unpack("<d", struct.pack("<Q", int(json.loads(e)["loss"], 16)))[0] for e in effects]


def test_two_runs_agree_bit_for_bit_and_another_seed_differs_at_every_step():
    a, da = train(params(), 12)
    b, db = train(params(), 12)
    c, _ = train(params(seed=1), 12)
    assert a == b and da == db
    assert all(x != y for x, y in zip(a, c))
    assert [json.loads(e)["step"] for e in a] == list(range(1, 13))


def one_hot(ids, vocab):
    out = np.zeros((ids.size, vocab))
    out[np.arange(ids.size), ids.reshape(-1)] = 1.0
    return out


def test_the_hand_written_gradient_is_the_loss_gradient_for_every_parameter():
    """Central differences in float64 agree with the backward pass: along a random direction through each
    parameter tensor, and entry by entry at a few places in each (the tied embedding gets both its parts)."""
    p = params(dtype="float64", vocab=11, d_model=8, heads=2, layers=2, seq_len=6, context=9, batch_size=3)
    model = Transformer(np, p)
    rng = np.random.default_rng(7)
    for a in model.params.values():  # away from the initial point: gains not all 1, weights of some size
        a += rng.standard_normal(a.shape) * 0.3
    tokens = corpus(3, 3, 7, 11)
    x1, y1 = one_hot(tokens[:, :-1], 11), one_hot(tokens[:, 1:], 11)
    _, grads = model.loss_and_grads(x1, y1, 0.5)
    assert list(grads) == list(model.params)
    h = 1e-6

    def slope(a, d):
        a += h * d
        up = float(model.loss_and_grads(x1, y1, 0.5)[0])
        a -= 2 * h * d
        down = float(model.loss_and_grads(x1, y1, 0.5)[0])
        a += h * d
        return (up - down) / (2 * h)

    def close(numeric, analytic):
        return abs(numeric - analytic) <= 1e-8 + 1e-6 * abs(analytic)

    for name, a in model.params.items():
        d = rng.standard_normal(a.shape)
        assert close(slope(a, d), float(np.sum(grads[name] * d))), name
        for flat in rng.choice(a.size, size=min(3, a.size), replace=False):
            e = np.zeros(a.size)
            e[flat] = 1.0
            assert close(slope(a, e.reshape(a.shape)), float(grads[name].reshape(-1)[flat])), (name, flat)
    assert not np.any(grads["wpe"][6:])  # positions past the sequence get no gradient


def test_the_loss_goes_down_and_the_learning_rate_warms_up_then_decays():
    from cutbench.workloads.torch_training import learning_rate

    effects, _ = train(params(), 40)
    curve = losses(effects)
    assert np.mean(curve[-5:]) < np.mean(curve[:5]) - 0.3, curve
    p = params(lr=1e-3, warmup_steps=10, decay_steps=110)
    assert learning_rate(p, 5) == pytest.approx(5e-4) and learning_rate(p, 10) == pytest.approx(1e-3)
    assert learning_rate(p, 60) == pytest.approx(0.55e-3)
    assert learning_rate(p, 110) == learning_rate(p, 500) == pytest.approx(1e-4)


def test_the_batches_are_the_same_whatever_the_number_of_workers():
    """In process, one worker, three workers: the same micro-batches in the same order across reshuffles, and
    the same after a restore to a cursor saved while batches were prefetched."""
    p = params(**SHORT)
    streams, saved = [], []
    for workers in (0, 1, 3):
        loader = Loader({**p, "loader_workers": workers})
        try:
            batches = [loader.next_batch() for _ in range(9)]
            saved.append(json.dumps(loader.state(), sort_keys=True))
            after = [loader.next_batch() for _ in range(5)]
            loader.restore(json.loads(saved[-1]))
            again = [loader.next_batch() for _ in range(5)]
            assert all(np.array_equal(x, y) for x, y in zip(after, again))
            assert len(loader.pids) == workers
            streams.append(batches + after)
        finally:
            loader.close()
    assert len(set(saved)) == 1
    for other in streams[1:]:
        assert all(np.array_equal(x, y) for x, y in zip(streams[0], other))
    rows = np.concatenate(streams[0][:6])
    assert sorted(map(tuple, rows)) == sorted(map(tuple, corpus(p["seed"], 24, 17, p["vocab"])))  # one epoch: each once
    assert not all(np.array_equal(x, y) for x, y in zip(streams[0][:6], streams[0][6:12]))  # reshuffled


class FakeRuntime:
    """What the workload asks of its runtime, without cut points or a receiver: the effects are collected."""

    def __init__(self, workdir: Path):
        self.xp, self.workdir, self.trial, self.epoch = np, workdir, "t", 0
        self.effects: dict[int, str] = {}
        self.receiver = SimpleNamespace(send_effect=self.send, wait_ack=lambda key: None)

    def send(self, trial, key, epoch, effect):
        self.effects[key] = effect

    def point(self, op, phase):
        pass

    def mark_startup(self, step):
        pass

    def commit_marker(self, op):
        pass


def workload(workdir: Path, **kw):
    workdir.mkdir()
    rt = FakeRuntime(workdir)
    w = TorchTraining(rt, api.resolve_params(TorchTraining, {**SHORT, "loader_workers": 1, **kw}))
    w.setup()
    return w, rt


def run_ops(w, ops):
    for op in ops:
        w.run_op(op)


@pytest.mark.parametrize("source", ["save_state", "own checkpoint"])
def test_a_run_continued_from_its_saved_state_is_the_uninterrupted_run(tmp_path: Path, source: str):
    """Saved after step 5 (mid-epoch, with batches prefetched in the worker's pipe), loaded into a fresh
    instance: steps 6..12 and the final state are those of the uninterrupted run."""
    whole, rt_whole = workload(tmp_path / "whole", cpt_every_ops=5)
    run_ops(whole, range(1, 13))
    whole.finish()
    first, rt_first = workload(tmp_path / "first", cpt_every_ops=5)
    run_ops(first, range(1, 6))
    path = tmp_path / "first" / "app_state"
    if source == "save_state":
        first.save_state(str(path))
    else:
        path = tmp_path / "first" / CPT_NAME  # written in place after step 5
    first.finish()
    again, rt_again = workload(tmp_path / "again", cpt_every_ops=5)
    assert again.load_state(str(path)) == 5
    run_ops(again, range(6, 13))
    again.finish()
    assert {**rt_first.effects, **rt_again.effects} == rt_whole.effects
    report, expected = again.report(), whole.report()
    assert report["checksum"] == expected["checksum"] and report["host_op"] == 12
    assert report["pointers_initial"] == report["pointers_final"]


@pytest.mark.parametrize(("bad", "field"), [
    ({"layers": 0}, "layers"),
    ({"seq_len": 80}, "seq_len"),
    ({"accum": 0}, "accum"),
    ({"heads": 3}, "heads"),
    ({"batch_size": 300}, "batch_size"),
    ({"loader_workers": -1}, "loader_workers"),
    ({"dtype": "float16"}, "dtype"),
    ({"lr": 0.0}, "lr"),
    ({"beta2": 1.0}, "beta2"),
    ({"cpt_every_ops": -1}, "cpt_every_ops"),
])
def test_parameters_out_of_range_are_named(bad, field):
    with pytest.raises(api.WorkloadError, match=f"parameter {field} = "):
        api.resolve_params(api.load("torch_training"), bad)


def test_a_sequence_longer_than_the_context_says_so():
    with pytest.raises(api.WorkloadError, match="longer than the model's context"):
        api.resolve_params(api.load("torch_training"), {"seq_len": 65})


def test_its_ground_truth_is_recorded_and_its_checkpoint_file_is_on_disk():
    cls = api.load("torch_training")
    assert api.records_reference(cls) and set(cls.arrays) == {"numpy", "cupy", "torch"}
    assert cls.features == frozenset({"device_memory"})
    assert "disk" in api.declared_domains(cls, {**cls.defaults, "cpt_every_ops": 5})
    assert "disk" not in api.declared_domains(cls, dict(cls.defaults))


PARENT = """
import sys, time
from cutbench.workloads.data_loader import Loader
from cutbench.workloads.torch_training import TorchTraining
loader = Loader({**TorchTraining.defaults, "loader_workers": 2})
loader.next_batch()
print(" ".join(map(str, loader.pids)), flush=True)
time.sleep(120)
"""


def test_no_worker_outlives_a_killed_parent():
    """The workers of a process killed with SIGKILL (no chance to close anything) leave at once."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        pids = [int(x) for x in parent.stdout.readline().split()]
        assert len(pids) == 2 and not any(is_zombie_or_gone(pid) for pid in pids)
        for pid in pids:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert b"--loader-worker" in cmdline and b"cutbench.workloads.data_loader" in cmdline
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert b"CUDA_VISIBLE_DEVICES=" in environ  # no GPU visible to a worker
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not all(is_zombie_or_gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(is_zombie_or_gone(pid) for pid in pids), [Path(f"/proc/{p}/cmdline").read_bytes() for p in pids]
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()


def test_its_own_checkpoint_is_one_file_rewritten_in_place(tmp_path: Path):
    from cutbench.workloads.common import load_state_file

    w, _ = workload(tmp_path / "w", cpt_every_ops=2)
    try:
        run_ops(w, range(1, 3))
        path = tmp_path / "w" / CPT_NAME
        inode = path.stat().st_ino
        run_ops(w, range(3, 5))
        assert path.stat().st_ino == inode and sorted(p.name for p in path.parent.iterdir()) == [CPT_NAME]
        header, arrays = load_state_file(str(path))
        assert header["step"] == header["committed"] == 4 and header["loader"]["index"] == 4 * 2 * 4 % 24
        assert set(arrays) == set(w.trainer.arrays())
    finally:
        w.finish()
