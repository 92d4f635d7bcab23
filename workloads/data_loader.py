"""The ``torch_training`` workload's data loader, a training script's: the corpus, a seeded sampler, and worker
processes that gather the batches (see :mod:`cutbench.workloads.torch_training` for what each does and why).

The corpus is drawn from the seed: sequences from a random sparse Markov chain (``SUCCESSORS`` possible
successors per token). The :class:`Sampler` shuffles it afresh each epoch and hands out micro-batches of
indices from a cursor ``(epoch, index)``; the :class:`Loader` gathers them in the process or asks its worker
processes (``python -m cutbench.workloads.data_loader --loader-worker CONFIG``: exec'd interpreters that import
no CUDA library and see no GPU), ``PREFETCH`` micro-batches ahead per worker, in the order they were asked for.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
from collections import deque
from typing import IO, Any

from cutbench.workloads.common import MASK

CORPUS_SALT = 0xC0_4B05
SHUFFLE_SALT = 0x5E_FF1E
PREFETCH = 2  # micro-batches asked of each worker ahead of the one consumed (PyTorch's prefetch_factor)
WORKER_WAIT_S = 10.0  # how long a worker asked to leave may take before it is killed
PR_SET_PDEATHSIG = 1
SUCCESSORS = 4  # the corpus's Markov chain: how many tokens may follow each token


def corpus(seed: int, sequences: int, length: int, vocab: int) -> Any:
    """Return ``sequences`` token sequences of ``length`` tokens (NumPy int64, ``[sequences, length]``) from a sparse
    Markov chain over ``vocab`` tokens, all drawn from ``seed``."""
    import numpy as np

    rng = np.random.default_rng([seed & MASK, CORPUS_SALT])
    # Each token is followed by one of SUCCESSORS tokens, with weights of its own: a chain the model can learn
    # (at most ln SUCCESSORS nats a token), held in memory linear in the vocabulary.
    succ = rng.integers(0, vocab, size=(vocab, SUCCESSORS))
    cum = np.cumsum(rng.dirichlet(np.ones(SUCCESSORS), size=vocab), axis=1)
    out = np.empty((sequences, length), dtype=np.int64)
    out[:, 0] = rng.integers(0, vocab, sequences)
    for t in range(1, length):
        prev = out[:, t - 1]
        pick = np.minimum(np.sum(cum[prev] < rng.random(sequences)[:, None], axis=1), SUCCESSORS - 1)
        out[:, t] = succ[prev, pick]
    return out


class Sampler:
    """Which sequences each micro-batch takes: an epoch-wise shuffle of the corpus and a cursor into it.

    Each epoch visits the corpus in a fresh permutation drawn from one seeded
    generator; a micro-batch is the next ``batch`` indices of it, and an epoch
    ends where fewer than ``batch`` remain. :meth:`state` is what a checkpoint
    keeps: the cursor ``(epoch, index)`` and the generator's state from before
    this epoch's permutation was drawn, from which :meth:`restore` draws it again.
    """

    def __init__(self, seed: int, sequences: int, batch: int):
        import numpy as np

        self.n, self.batch = sequences, batch
        self.rng = np.random.default_rng([seed & MASK, SHUFFLE_SALT])
        self.epoch, self.index = 0, 0
        self._shuffle()

    def _shuffle(self) -> None:
        self.epoch_rng = self.rng.bit_generator.state
        self.order = self.rng.permutation(self.n)

    def next(self) -> Any:
        """The indices of the next micro-batch (NumPy int64), starting a new epoch where this one is used up."""
        if self.index + self.batch > self.n:
            self.epoch, self.index = self.epoch + 1, 0
            self._shuffle()
        idx = self.order[self.index:self.index + self.batch]
        self.index += self.batch
        return idx

    def state(self) -> dict[str, Any]:
        """The cursor and the generator state of this epoch (JSON-able; never mutated afterwards)."""
        return {"epoch": self.epoch, "index": self.index, "rng": self.epoch_rng}

    def restore(self, state: dict[str, Any]) -> None:
        """Go back to :meth:`state`'s position: the same epoch's permutation, the same cursor."""
        self.rng.bit_generator.state = state["rng"]
        self._shuffle()
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


class Loader:
    """Micro-batches of token sequences (NumPy int64, ``[batch_size, seq_len + 1]``) in the sampler's order,
    gathered in the process (``loader_workers = 0``) or by worker processes (see module docstring).

    Requests go to the workers in turn and their answers are read in the same
    turn, so the order does not depend on the number of workers. The workers
    start at the first batch asked for (after a ``load_state`` has set the
    cursor). :meth:`state` is the position after the last batch *consumed*,
    not the last one asked for: what is prefetched is asked for again after a
    restore.
    """

    def __init__(self, p: dict[str, Any]):
        self.config = {"seed": p["seed"], "sequences": p["corpus_sequences"], "length": p["seq_len"] + 1,
                       "vocab": p["vocab"]}
        self.sampler = Sampler(p["seed"], p["corpus_sequences"], p["batch_size"])
        self.consumed = self.sampler.state()
        self.workers = int(p["loader_workers"])
        self.rows = None if self.workers else corpus(**self.config)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pending: deque[tuple[int, dict[str, Any]]] = deque()  # (worker, sampler state after it), oldest first
        self.asked = 0

    @property
    def pids(self) -> list[int]:
        """The worker processes' pids (empty before the first batch, or with ``loader_workers = 0``)."""
        return [proc.pid for proc in self.procs]

    def next_batch(self) -> Any:
        """The next micro-batch; raises RuntimeError when a worker is gone."""
        if not self.workers:
            idx = self.sampler.next()
            self.consumed = self.sampler.state()
            assert self.rows is not None  # the corpus is in the process when there are no workers (__init__)
            return self.rows[idx]
        if not self.procs:
            self._start()
        self._fill()
        worker, after = self.pending.popleft()
        self._fill()  # the worker's queue stays full while this batch is read
        batch = self._receive(worker)
        self.consumed = after
        return batch

    def state(self) -> dict[str, Any]:
        """The position after the last batch consumed (what a checkpoint keeps)."""
        return self.consumed

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: batches asked for and not consumed are read and dropped, then the sampler
        goes back to ``state``."""
        while self.pending:
            self._receive(self.pending.popleft()[0])
        self.sampler.restore(state)
        self.consumed = self.sampler.state()

    def close(self) -> None:
        """Let the workers go (EOF on their stdin) and reap them; one that stays is killed."""
        procs, self.procs = self.procs, []
        self.pending.clear()
        for proc in procs:
            try:
                _pipes(proc)[0].close()
            except OSError:
                pass
        for proc in procs:
            try:
                proc.wait(timeout=WORKER_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            _pipes(proc)[1].close()

    # -- the workers' side of the pipes -------------------------------------------
    def _start(self) -> None:
        cfg = json.dumps({**self.config, "parent": os.getpid()})
        # No GPU for a worker, even if something it imports looked for one.
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        for _ in range(self.workers):
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "cutbench.workloads.data_loader", "--loader-worker", cfg],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env))

    def _fill(self) -> None:
        import numpy as np

        while len(self.pending) < PREFETCH * self.workers:
            worker = self.asked % self.workers
            idx = self.sampler.next()
            proc = self.procs[worker]
            stdin = _pipes(proc)[0]
            try:
                stdin.write(struct.pack("<I", len(idx)) + np.asarray(idx, dtype="<i8").tobytes())
                stdin.flush()
            except (BrokenPipeError, ValueError):
                raise RuntimeError(f"loader worker {worker} (pid {proc.pid}) is gone "
                                   f"(exit status {proc.poll()})") from None
            self.pending.append((worker, self.sampler.state()))
            self.asked += 1

    def _receive(self, worker: int) -> Any:
        import numpy as np

        proc = self.procs[worker]
        stdout = _pipes(proc)[1]
        head = stdout.read(8)
        if len(head) < 8:
            raise RuntimeError(f"loader worker {worker} (pid {proc.pid}) closed its pipe (exit status {proc.poll()})")
        rows, cols = struct.unpack("<II", head)
        data = stdout.read(rows * cols * 8)
        if len(data) < rows * cols * 8:
            raise RuntimeError(f"loader worker {worker} (pid {proc.pid}) closed its pipe mid-batch")
        return np.frombuffer(data, dtype="<i8").reshape(rows, cols).astype(np.int64)


def _pipes(proc: subprocess.Popen[bytes]) -> tuple[IO[bytes], IO[bytes]]:
    """A loader worker's stdin and stdout (``Loader._start`` opens both as pipes)."""
    assert proc.stdin is not None and proc.stdout is not None
    return proc.stdin, proc.stdout


def _read_exact(stream: Any, n: int) -> bytes:
    data = stream.read(n)
    return data if len(data) == n else b""


def worker_main(cfg: dict[str, Any]) -> int:
    """A loader worker: answer each request on stdin (a count, then that many int64 indices) with the batch of
    those sequences on stdout (rows, columns, then the int64 tokens), until stdin ends; return the exit code."""
    import ctypes

    import numpy as np

    try:
        # Killed with the workload: a SIGKILL to it leaves no worker behind. The signal follows the thread that
        # started this process, the workload's main thread, which lives as long as the workload does.
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != cfg["parent"]:
        return 0  # the workload died before the line above took effect
    rows = corpus(cfg["seed"], cfg["sequences"], cfg["length"], cfg["vocab"])
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        head = _read_exact(inp, 4)
        if not head:
            return 0  # EOF: the workload closed its end, or is gone
        (n,) = struct.unpack("<I", head)
        idx = np.frombuffer(_read_exact(inp, 8 * n), dtype="<i8")
        if len(idx) != n:
            return 0
        batch = np.ascontiguousarray(rows[idx], dtype="<i8")
        try:
            out.write(struct.pack("<II", *batch.shape) + batch.tobytes())
            out.flush()
        except BrokenPipeError:
            return 0



def main(argv: list[str] | None = None) -> int:
    """Run ``python -m cutbench.workloads.data_loader --loader-worker CONFIG``: one loader worker."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "--loader-worker":
        print("usage: python -m cutbench.workloads.data_loader --loader-worker CONFIG_JSON", file=sys.stderr)
        return 2
    return worker_main(json.loads(args[1]))


if __name__ == "__main__":
    sys.exit(main())
