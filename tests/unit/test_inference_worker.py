"""``inference_worker`` on NumPy, in process: the cached decode is the transformer's full causal forward, sessions
come and go mid-generation, and the engine's own checkpoint brings back the weights but not the sessions (its
runs through CRIU are in tests/criu/test_inference_worker.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cutbench.workloads import api
from cutbench.workloads.common import MemoryCursor
from cutbench.workloads.inference_worker import Engine, InferenceWorker, TinyDecoder


def params(**kw):
    return {**InferenceWorker.defaults, **kw}


def serve(p, steps, model=None, engine=None, queue=None):
    """``steps`` engine steps (run_op without its cut points); returns the model, engine, queue and effects."""
    model = model or TinyDecoder(np, p)
    engine = engine or Engine(p)
    queue = queue or MemoryCursor()
    out = []
    for _ in range(steps):
        engine.admit(queue.take)
        tokens, positions = engine.inputs()
        model.launch(tokens, positions)
        out.append(engine.advance(model.read_next()))
    return model, engine, queue, out


def full_forward(model: TinyDecoder, seq: list[int]) -> np.ndarray:
    """The greedy next token after every prefix of ``seq``: the whole causal forward, no cache."""
    n, w, h, d = len(seq), model.width, model.heads, model.head_dim
    x = model.emb[seq] + model.pos_emb[:n]

    def norm(v, g):
        return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + 1e-6) * g

    causal = np.where(np.arange(n)[None, :] <= np.arange(n)[:, None], 0.0, -1e30).astype(np.float32)
    for layer in model.layer:
        a = norm(x, layer["g1"])
        q, k, v = (np.reshape(a @ layer[m], (n, h, d)).transpose(1, 0, 2) for m in ("wq", "wk", "wv"))
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(d) + causal
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))
        o = (e / e.sum(axis=-1, keepdims=True)) @ v
        x = x + o.transpose(1, 0, 2).reshape(n, w) @ layer["wo"]
        x = x + np.maximum(norm(x, layer["g2"]) @ layer["w1"], 0) @ layer["w2"]
    return np.argmax(norm(x, model.g_final) @ model.head, axis=-1)


def test_two_runs_agree_bit_for_bit_and_another_seed_serves_other_tokens():
    _, _, _, a = serve(params(), 24)
    _, _, _, b = serve(params(), 24)
    _, _, _, c = serve(params(seed=1), 24)
    assert a == b
    assert [s["tokens"] for s in a if s["tokens"]] != [s["tokens"] for s in c if s["tokens"]]


def test_the_cached_decode_is_the_full_causal_forward_of_each_session():
    """Every token a session generated is the argmax of the transformer run on its whole text so far: the KV
    cache, its masking and the batching over slots change nothing (a cache written at the wrong position, a
    slot attending to another's keys or to positions it has not reached would)."""
    p = params(sessions=3)
    model, _, _, effects = serve(p, 30)
    texts: dict[int, list[int]] = {}
    for effect in effects:
        for rid, pos, tok in effect["tokens"]:
            texts.setdefault(rid, []).append((pos, tok))
    engine = Engine(p)
    assert len(texts) >= 4  # more sessions than slots went through
    for rid, generated in texts.items():
        prompt = engine.request(rid)["prompt"]
        assert [pos for pos, _ in generated] == list(range(len(prompt), len(prompt) + len(generated)))
        seq = prompt + [tok for _, tok in generated]
        predicted = full_forward(model, seq[:-1])
        assert [int(t) for t in predicted[len(prompt) - 1:]] == [tok for _, tok in generated], rid


def test_sessions_finish_at_different_steps_and_new_ones_are_admitted_mid_generation():
    p = params()
    _, engine, _, effects = serve(p, 40)
    finished = [i for i, e in enumerate(effects) if e["done"]]
    assert len(set(finished)) > 2  # not all at once
    # some step decodes a session still in its prompt beside another generating: continuous batching
    first_token = {}
    for i, effect in enumerate(effects):
        for rid, _, _ in effect["tokens"]:
            first_token.setdefault(rid, i)
    admitted_late = [rid for rid, i in first_token.items() if rid > p["sessions"]]
    assert admitted_late and any(
        any(rid2 != rid and first_token.get(rid2, 99) < first_token[rid] <= i for rid2, _, _ in effects[i]["tokens"])
        for rid in admitted_late for i in range(first_token[rid], len(effects)))
    budgets = {rid: engine.request(rid)["budget"] for rid, _ in (d for e in effects for d in e["done"])}
    counts: dict[int, int] = {}
    for effect in effects:
        for rid, _, _ in effect["tokens"]:
            counts[rid] = counts.get(rid, 0) + 1
    assert all(counts[rid] == budget for rid, budget in budgets.items())
    assert len(set(budgets.values())) > 1


class _Rt:
    """Just what setup, save_state and load_state use of the runtime: the array module, the trial directory, the start-up clock."""

    def __init__(self, workdir):
        self.xp, self.workdir, self.startup = np, workdir, {}

    def mark_startup(self, step):
        self.startup[step] = 0.0


def _worker(tmp_path, **kw):
    w = InferenceWorker(_Rt(tmp_path), params(**kw))
    w.setup()
    return w


@pytest.mark.parametrize("app_checkpoint, continues", [("sessions", True), ("weights", False)])
def test_the_engine_s_own_checkpoint_brings_back_sessions_only_when_it_saves_them(tmp_path, app_checkpoint, continues):
    """With the sessions saved, a fresh engine continues bit for bit; from the weights alone it comes back
    empty, and what it serves next is not what the uninterrupted engine served."""
    _, _, _, whole = serve(params(), 24)
    first = _worker(tmp_path / "a", app_checkpoint=app_checkpoint)
    (tmp_path / "a").mkdir(exist_ok=True)
    serve(first.p, 10, first.model, first.engine, first.queue)
    first.committed = 10
    first.save_state(str(tmp_path / "state.npz"))
    (tmp_path / "b").mkdir()
    again = _worker(tmp_path / "b", app_checkpoint=app_checkpoint)
    assert again.load_state(str(tmp_path / "state.npz")) == 10
    _, _, _, rest = serve(again.p, 14, again.model, again.engine, again.queue)
    assert (rest == whole[10:]) is continues


@pytest.mark.parametrize("bad, words", [
    ({"sessions": 0}, "sessions"),
    ({"context": 16, "prompt_tokens": 8, "max_new_tokens": 12}, "longer than the KV cache"),
    ({"width": 30, "heads": 4}, "multiple of heads"),
    ({"queue": "redis"}, "queue"),
    ({"app_checkpoint": "everything"}, "app_checkpoint"),
])
def test_parameters_out_of_range_are_refused_by_name(bad, words):
    with pytest.raises(ValueError, match=words):
        api.resolve_params(api.load("inference_worker"), bad)


def test_its_effect_is_json_with_the_step_the_tokens_and_the_replies():
    _, _, _, effects = serve(params(), 16)
    body = json.loads(json.dumps({"step": 16, **effects[-1]}))
    assert set(body) == {"step", "tokens", "done"}
    assert InferenceWorker.ground_truth == "recorded" and "numpy" in InferenceWorker.arrays
