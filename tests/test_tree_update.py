"""The tree-packed update (GRPOConfig.packing="tree") against the per-row update, on every family of
the conformance matrix: the same loss, per-token log-probabilities and adapter gradients.

Tolerance. Both paths run the same float32 operations on the same values; what differs is how many
masked keys each softmax row and each key-gradient sum spans, and in which order a shared token's
gradient is summed (once per row through it, against once for the node). A float32 sum of n terms
whose rounding errors have random signs is off by about sqrt(n) * u relative (u = 2**-24, the unit
roundoff), and the errors compound over the blocks of the network. So logprobs and the loss (O(1)
values) agree to ``TOL`` absolute and gradients to ``TOL`` relative to their largest entry, with
``TOL = 16 * u * sqrt(n) * (layers + 1)``, n the largest trie's token count (the longest sum) and 16
a margin for the few operations per block.
"""

from __future__ import annotations

import numpy as np
import pytest

import autocurricula  # noqa: F401
import mlx.core as mx

from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec
from autocurricula.engine.models.tree import FALLBACK, TreeCache
from autocurricula.engine.tiny import FAMILIES, build_family_model
from autocurricula.records import Turn
from autocurricula.training import Updater
from autocurricula.training.config import GRPOConfig
from autocurricula.training.packing import tree_cap, tree_chunks, tree_microbatches
from autocurricula.training.trie import check_ancestor_mask, pack

U = 2.0 ** -24
SPEC = LoraSpec(r=4, lora_alpha=8)  # the family's own default targets
TREE_FAMILIES = [f for f, (model_type, _) in FAMILIES.items() if model_type not in FALLBACK]
ROW_FAMILIES = [f for f, (model_type, _) in FAMILIES.items() if model_type in FALLBACK]


def tolerance(turns, layers: int) -> float:
    mine: dict = {}
    for t in turns:
        mine.setdefault(t.player, []).append(t.prompt_ids + t.completion_ids)
    n = max(len(pack(rows)) for rows in mine.values())
    return 16 * U * np.sqrt(n) * (layers + 1)


@pytest.fixture(scope="module")
def family_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tree-families")


def engine_of(path) -> Engine:
    return Engine(str(path), config=EngineConfig(max_slots=4))


def load_players(engine, names):
    dims = engine.linear_dims
    for i, n in enumerate(names):
        engine.load_adapter(n, AdapterWeights.random({p: dims[p] for p in SPEC.resolve(dims, engine.model_type)},
                                                     SPEC, seed=i, b_std=0.05))


def _turn(player, prompt, completion, adv, game="g", rng=None):
    rng = rng or np.random.default_rng(0)
    return Turn(player, game, "X", list(prompt), list(completion), (-rng.uniform(0.5, 3, len(completion))).tolist(),
                advantage=float(adv))


def grpo_group(player, rng, prompt_len=24, g=6, vocab=500):
    """G completions of one prompt; two of them share their first tokens and differ right after."""
    prompt = rng.integers(3, vocab, prompt_len).tolist()
    comps = [rng.integers(3, vocab, int(rng.integers(4, 12))).tolist() for _ in range(g)]
    comps[1] = comps[0][:3] + [(comps[0][3] + 1) % vocab or 3] + comps[1][4:]
    return [_turn(player, prompt, c, rng.normal(), game=f"{player}-grp", rng=rng) for c in comps]


def chain(player, rng, turns=6, vocab=500):
    """A conversation: each turn's prompt is the previous prompt, its reply and the opponent's."""
    prompt, out = rng.integers(3, vocab, 12).tolist(), []
    for k in range(turns):
        reply = rng.integers(3, vocab, int(rng.integers(3, 8))).tolist()
        out.append(_turn(player, prompt, reply, rng.normal(), game=f"{player}-chat", rng=rng))
        prompt = prompt + reply + rng.integers(3, vocab, 10).tolist()
    return out


def mixed_round(names, rng):
    return [t for n in names for t in grpo_group(n, rng) + chain(n, rng)]


def forward_backward(engine, turns, packing, **config):
    """(metrics, {module: {"a", "b": gradient}}) of one update's forward and backward, nothing applied."""
    upd = Updater(engine, GRPOConfig(packing=packing, **config))

    def job():
        names = sorted({t.player for t in turns})
        weights = {n: engine.adapter_weights(n) for n in names}
        paths = sorted({p for w in weights.values() for p in w.modules})
        rank = max(w.rank for w in weights.values())
        with engine.training_stacks(paths, rank) as stacks:
            metrics, _, grads = upd._forward_backward(stacks, turns, names, weights, paths, rank)
        return metrics, {p: {k: np.array(v) for k, v in g.items()} for p, g in grads.items()}

    return engine.call(job).result()


def token_logprobs(engine, turns, packing):
    """Per row, the per-token log-probabilities the update's loss reads, under the rows' adapters."""
    upd = Updater(engine, GRPOConfig(packing=packing))

    def job():
        names = sorted({t.player for t in turns})
        weights = {n: engine.adapter_weights(n) for n in names}
        paths = sorted({p for w in weights.values() for p in w.modules})
        rank = max(w.rank for w in weights.values())
        rows = upd._rows(turns, names)
        params = upd._stack_params(names, weights, paths, rank)
        scales = mx.array([weights[n].scale for n in names], dtype=mx.float32)[:, None, None]
        out = {}
        with engine.training_stacks(paths, rank) as stacks:
            stacks.set({p: (params[p]["a"], params[p]["b"] * scales) for p in params}, len(names))
            if packing == "tree":
                ids = [r.ids for r in rows]
                for mb in tree_microbatches(tree_chunks(ids, [r.player for r in rows], 4096), 4096, 1):
                    batch = upd._tree_arrays(mb, rows)
                    stacks.route(batch["slots"], sorted_entries=True)
                    lp = np.array(engine.tree_logprobs(batch["ids"], batch["depth"], batch["tin"], batch["tout"],
                                                       batch["pick"], batch["tgt"], 1.0))
                    for j, i in enumerate(i for c in mb for i in c.rows):
                        out[i] = lp[j, : rows[i].n]
            else:
                for i, r in enumerate(rows):
                    batch = upd._arrays([r])
                    stacks.route(batch["slots"], sorted_entries=True)
                    out[i] = np.array(engine.token_logprobs(batch["ids"], batch["pos"], batch["tgt"], 1.0))[0]
        return [out[i] for i in range(len(rows))]

    return engine.call(job).result()


def assert_same_update(engine, turns, layers, **config):
    tol = tolerance(turns, layers)
    want_m, want_g = forward_backward(engine, turns, "rows", **config)
    got_m, got_g = forward_backward(engine, turns, "tree", **config)
    assert got_m["computed_tokens"] < want_m["computed_tokens"]  # the tree really computed less
    assert got_m["tokens"] == want_m["tokens"] and got_m["rows"] == want_m["rows"]
    assert got_m["loss"] == pytest.approx(want_m["loss"], abs=tol)
    for k in (k for k in want_m if k.startswith("loss/")):
        assert got_m[k] == pytest.approx(want_m[k], abs=tol), k
    assert want_g.keys() == got_g.keys()
    for p in want_g:
        for k in ("a", "b"):
            scale = np.abs(want_g[p][k]).max()
            assert scale > 0, f"no gradient reached {p}.{k}: the comparison would prove nothing"
            np.testing.assert_allclose(got_g[p][k], want_g[p][k], rtol=0, atol=tol * scale, err_msg=f"{p}.{k}")
    return got_m, want_m


# ------------------------------------------------------------------- exactness on every family

@pytest.mark.parametrize("family", TREE_FAMILIES)
def test_mixed_round_equals_rows_on_every_family(family, family_dir):
    """Three players, each with a GRPO group and a multi-turn chain, in one fused step. The chain's
    last rows pass the tiny models' 64-token sliding window (mistral_window, phi3_window, gemma2,
    gemma3), so the window is counted along the path."""
    engine = engine_of(build_family_model(family_dir / family, family))
    try:
        names = ["p0", "p1", "p2"]
        load_players(engine, names)
        turns = mixed_round(names, np.random.default_rng(1))
        assert max(len(t.prompt_ids) + len(t.completion_ids) for t in turns) > 64
        layers = engine.num_layers
        assert_same_update(engine, turns, layers)
        rows = token_logprobs(engine, turns, "rows")
        tree = token_logprobs(engine, turns, "tree")
        tol = tolerance(turns, layers)
        for i, (a, b) in enumerate(zip(tree, rows)):
            np.testing.assert_allclose(a, b, rtol=0, atol=tol, err_msg=f"row {i}")
    finally:
        engine.close()


# the rest of the conformance matrix (tests/config_models.py): scaled rotations, mixtures of experts,
# DeepSeek's latent attention, partial rotations
CONFIG_CASES = ["llama-linear", "llama-llama3", "llama-yarn", "phi3-longrope-4k", "gemma3-linear", "gpt_neox-yarn",
                "glm4-linear", "stablelm", "granite-llama3", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"]


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_config_case_equals_rows(case, family_dir):
    from config_models import build, tokenizer_source

    engine = engine_of(build(family_dir / f"case-{case}", case, tokenizer_source(family_dir / "tokenizer")))
    try:
        assert engine.tree_fallback() is None
        load_players(engine, ["p0", "p1"])
        turns = mixed_round(["p0", "p1"], np.random.default_rng(11))
        assert_same_update(engine, turns, engine.num_layers)
    finally:
        engine.close()


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_quantized_base_equals_rows(family, family_dir):
    engine = engine_of(build_family_model(family_dir / f"{family}-4bit", family, quantize_bits=4))
    try:
        load_players(engine, ["p0", "p1"])
        turns = mixed_round(["p0", "p1"], np.random.default_rng(2))
        assert_same_update(engine, turns, engine.num_layers)
    finally:
        engine.close()


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("extra", [{}, {"beta": 0.05, "entropy_coef": 0.01}, {"importance_sampling_level": "sequence"}])
def test_every_normalisation_equals_rows(loss_type, extra, family_dir):
    """Per row, per token and per sequence: each completion token keeps its row's weight."""
    engine = engine_of(build_family_model(family_dir / "llama", "llama"))
    try:
        load_players(engine, ["p0", "p1"])
        turns = grpo_group("p0", np.random.default_rng(3)) + chain("p1", np.random.default_rng(4))
        got, want = assert_same_update(engine, turns, engine.num_layers, loss_type=loss_type, **extra)
        if extra.get("beta"):
            assert got["kl"] == pytest.approx(want["kl"], abs=1e-5)
    finally:
        engine.close()


def test_grpo_group_and_chain_compute_each_token_once(family_dir):
    engine = engine_of(build_family_model(family_dir / "llama", "llama"))
    try:
        load_players(engine, ["p0"])
        group = grpo_group("p0", np.random.default_rng(5))
        m, _ = forward_backward(engine, group, "tree")
        prompt = len(group[0].prompt_ids)
        assert m["computed_tokens"] == len(pack([t.prompt_ids + t.completion_ids for t in group]))
        assert m["computed_tokens"] == prompt + sum(len(t.completion_ids) for t in group) - 3  # rows 0, 1 share 3
        talk = chain("p0", np.random.default_rng(6))
        m, _ = forward_backward(engine, talk, "tree")
        assert m["computed_tokens"] == len(talk[-1].prompt_ids) + len(talk[-1].completion_ids)  # one path
    finally:
        engine.close()


# ------------------------------------------------------------------- the fallback, pinned

@pytest.mark.parametrize("family", ROW_FAMILIES)
def test_families_that_cannot_share_state_fall_back_to_rows_by_name(family, family_dir, caplog):
    engine = engine_of(build_family_model(family_dir / family, family))
    try:
        model_type = FAMILIES[family][0]
        assert model_type in engine.tree_fallback()
        load_players(engine, ["p0"])
        turns = grpo_group("p0", np.random.default_rng(7))
        upd = Updater(engine, GRPOConfig())
        with caplog.at_level("WARNING"):
            m1 = upd.step(turns)
            m2 = upd.step(turns)
        said = [r for r in caplog.records if "packs rows one by one" in r.getMessage()]
        assert len(said) == 1 and model_type in said[0].getMessage()  # once, by name
        rows = sum(len(t.prompt_ids) + len(t.completion_ids) - 1 for t in turns)
        assert m1["computed_tokens"] == m2["computed_tokens"] == rows
    finally:
        engine.close()


# ------------------------------------------------------------------- the checks would catch a wrong tree

def test_wrong_positions_or_mask_or_weights_are_caught(family_dir, monkeypatch):
    """The comparison above fails when the positions are packed indices, when the mask is causal
    over the packed order, or when a row's weight goes to another row's tokens."""
    import autocurricula.training.update as update

    engine = engine_of(build_family_model(family_dir / "llama", "llama"))
    try:
        load_players(engine, ["p0"])
        turns = grpo_group("p0", np.random.default_rng(8)) + chain("p0", np.random.default_rng(9))
        layers = engine.num_layers
        real = update.Updater._tree_arrays

        def packed_index(self, batch, rows):
            out = real(self, batch, rows)
            out["depth"] = mx.broadcast_to(mx.arange(out["ids"].shape[1]), out["ids"].shape)
            return out

        def causal(self, batch, rows):
            out = real(self, batch, rows)
            n = out["ids"].shape[1]
            out["tout"] = mx.full(out["ids"].shape, n, dtype=mx.int32)  # every earlier token visible
            return out

        def swapped_weights(self, batch, rows):
            out = real(self, batch, rows)
            out["w"] = out["w"][::-1]
            return out

        for wrong in (packed_index, causal, swapped_weights):
            monkeypatch.setattr(update.Updater, "_tree_arrays", wrong)
            with pytest.raises(AssertionError):
                assert_same_update(engine, turns, layers)
        monkeypatch.setattr(update.Updater, "_tree_arrays", real)
        assert_same_update(engine, turns, layers)
    finally:
        engine.close()


def test_tree_cache_mask_is_the_ancestor_relation_and_the_window_counts_along_the_path():
    rows = [[5, 6, 7, 9, 1], [5, 6, 8, 9], [5, 6, 8, 2, 3, 4], [7]]
    trie = pack(rows)
    cache = TreeCache(mx.array(trie.positions[None]), mx.array(trie.tin[None]), mx.array(trie.tout[None]))
    mask = np.array(cache.make_mask(len(trie)))[0, 0]
    check_ancestor_mask(mask, trie.parent)
    windowed = np.array(cache.make_mask(len(trie), window_size=2))[0, 0]
    depth = trie.positions
    assert np.array_equal(windowed, mask & (depth[:, None] - depth[None, :] < 2))
    # packed neighbours that are not on one path stay invisible even within the window
    q = int(trie.rows[2][3])  # the "2" after 5 6 8
    k = int(trie.rows[1][3])  # the "9" after 5 6 8: a sibling, packed right before it
    assert not windowed[q, k] and windowed[q, int(trie.rows[2][2])]


# ------------------------------------------------------------------- memory: the plan never exceeds rows

def test_tree_microbatches_hold_no_more_than_row_microbatches():
    rng = np.random.default_rng(10)
    budget = 256
    ids, players = [], []
    for p in range(3):
        for t in chain(f"p{p}", rng, turns=6) + grpo_group(f"p{p}", rng, g=8):
            ids.append(t.prompt_ids + t.completion_ids)
            players.append(p)
    longest = max(map(len, ids))
    chunks = tree_chunks(ids, players, budget)
    assert sorted(i for c in chunks for i in c.rows) == list(range(len(ids)))  # every row once
    assert all(len({players[i] for i in c.rows}) == 1 for c in chunks)  # one player per tree
    cap = tree_cap(budget, longest)
    assert all(len(c.trie) <= cap for c in chunks)
    for mb in tree_microbatches(chunks, budget, longest):
        width = max(len(c.trie) for c in mb)
        assert len(mb) == 1 or (len(mb) * width <= budget and len(mb) * width * width <= budget * longest)
        assert [c.player for c in mb] == sorted(c.player for c in mb)


def test_tries_are_cut_where_the_dense_mask_costs_more_than_sharing_saves():
    """The cut points minimise the summed trie cost n + c n^2 (checked against every cut set of
    small runs), so the plan never costs more than each row alone under the same model."""
    import itertools

    from autocurricula.training.packing import _cuts

    def cost(rows, c):
        n = len(pack(rows))
        return n + c * n * n

    rng = np.random.default_rng(12)
    for _ in range(150):
        rows = sorted(rng.integers(3, 6, int(rng.integers(1, 6))).tolist() for _ in range(int(rng.integers(1, 7))))
        c = float(rng.choice([0.0, 0.01, 0.1, 1.0]))
        got = sum(cost(rows[lo:hi], c) for lo, hi in _cuts([np.array(r) for r in rows], 10**6, c))
        m = len(rows)
        best = min(sum(cost(rows[a:b], c) for a, b in zip((0, *cut), (*cut, m)))
                   for k in range(m) for cut in itertools.combinations(range(1, m), k))
        assert got == pytest.approx(best)
        assert got <= sum(cost([r], c) for r in rows) + 1e-9
    group = [[1, 2, 3, 4, 5, 6] + rng.integers(3, 100, 6).tolist() for _ in range(8)]
    assert len(tree_chunks(group, [0] * 8, 2048, pair_cost=1e-3)) == 1  # cheap scores: one trie
    assert len(tree_chunks(group, [0] * 8, 2048, pair_cost=1.0)) > 1  # dear scores: rows mostly alone
