"""The prefix trie of a step's rows (autocurricula/training/trie.py), against brute force: the nodes
are the rows' distinct prefixes, the mask is "k's prefix is a prefix of q's" checked on every pair,
positions are prefix lengths, and a two-layer attention over the packed trie gives every row's
outputs as the row computed alone does."""

import numpy as np
import pytest

from autocurricula.training.trie import (PackedTrie, ancestor_mask, check_ancestor_mask, check_packing,
                                         completion_targets, pack, pack_players, token_counts, trie_size)


def node_prefixes(trie: PackedTrie, rows) -> dict[int, tuple]:
    """Each packed index's prefix, read off the row maps (one prefix per index, or the test fails)."""
    out: dict[int, tuple] = {}
    for row, idx in zip(rows, trie.rows):
        for j, i in enumerate(idx.tolist()):
            assert out.setdefault(i, tuple(row[: j + 1])) == tuple(row[: j + 1]), "one node, two prefixes"
    return out


def assert_exact(rows) -> PackedTrie:
    """The packing of ``rows`` checked against the dense brute-force reference."""
    trie = pack(rows)
    check_packing(trie, rows)
    distinct = {tuple(r[: j + 1]) for r in rows for j in range(len(r))}
    assert len(trie) == len(distinct) == trie_size(rows)
    prefix = node_prefixes(trie, rows)
    assert sorted(prefix) == list(range(len(trie)))
    assert len(set(prefix.values())) == len(trie)  # distinct nodes are distinct prefixes
    for i, p in prefix.items():
        assert trie.tokens[i] == p[-1] and trie.positions[i] == len(p) - 1
        assert trie.parent[i] == (-1 if len(p) == 1 else next(k for k, q in prefix.items() if q == p[:-1]))
    n = len(trie)
    want = np.array([[prefix[q][: len(prefix[k])] == prefix[k] for k in range(n)] for q in range(n)], bool)
    want = want.reshape(n, n)
    np.testing.assert_array_equal(trie.mask(), want)
    np.testing.assert_array_equal(ancestor_mask(trie.tin, trie.tout), want)
    check_ancestor_mask(trie.mask(), trie.parent)
    for row, idx in zip(rows, trie.rows):  # every row's map is its own path, in order
        assert [prefix[i] for i in idx.tolist()] == [tuple(row[: j + 1]) for j in range(len(row))]
    return trie


def attention_outputs(tokens, positions, mask, seed=0, layers=2, dim=8, vocab=64, max_pos=64):
    """A tiny transformer (learned token and position embeddings, ``layers`` single-head attention
    layers with residuals) in float64: what a model computes at every token under ``mask``."""
    rng = np.random.default_rng(seed)
    emb, pos_emb = rng.normal(size=(vocab, dim)), rng.normal(size=(max_pos, dim))
    h = emb[np.asarray(tokens)] + pos_emb[np.asarray(positions)]
    for _ in range(layers):
        wq, wk, wv = (rng.normal(size=(dim, dim)) / np.sqrt(dim) for _ in range(3))
        scores = (h @ wq) @ (h @ wk).T / np.sqrt(dim)
        scores = np.where(mask, scores, -np.inf)
        scores -= scores.max(axis=1, keepdims=True)
        p = np.exp(scores)
        h = h + (p / p.sum(axis=1, keepdims=True)) @ (h @ wv)
    return h


def assert_packed_forward_equals_rows(rows):
    """Every row's outputs, computed alone (causal mask, positions 0..L-1), equal the packed trie's
    outputs gathered through the row map: the mask, the positions and the map are right together."""
    trie = pack(rows)
    packed = attention_outputs(trie.tokens, trie.positions, trie.mask())
    for row, idx in zip(rows, trie.rows):
        if not len(row):
            continue
        alone = attention_outputs(row, np.arange(len(row)), np.tril(np.ones((len(row), len(row)), bool)))
        np.testing.assert_allclose(packed[idx], alone, rtol=1e-12, atol=1e-12)


def test_two_rows_that_differ_right_after_their_shared_prefix():
    rows = [[5, 6, 7, 9], [5, 6, 8, 9]]
    trie = assert_exact(rows)
    # sorted rows: [5 6 7 9] then [5 6 8 9]; the second shares "5 6" and adds its own "8 9"
    assert trie.tokens.tolist() == [5, 6, 7, 9, 8, 9]
    assert trie.positions.tolist() == [0, 1, 2, 3, 2, 3]  # depth, not packed index
    assert trie.parent.tolist() == [-1, 0, 1, 2, 1, 4]
    assert trie.tout.tolist() == [6, 6, 4, 4, 6, 6]
    assert [m.tolist() for m in trie.rows] == [[0, 1, 2, 3], [0, 1, 4, 5]]
    mask = trie.mask()
    assert mask[4].tolist() == [True, True, False, False, True, False]  # "8" sees 5 6 and itself, not "7 9"
    assert mask[5].tolist() == [True, True, False, False, True, True]  # the second "9" sees its own path only
    assert not mask[3, 4] and not mask[3, 5]  # nor does the first row see the second's branch
    assert_packed_forward_equals_rows(rows)


def test_grpo_group_shares_its_prompt():
    rng = np.random.default_rng(0)
    prompt = rng.integers(1, 64, 12).tolist()
    completions = [rng.integers(1, 4, 5).tolist() for _ in range(8)]  # a small vocabulary: some share a start
    completions[3] = completions[1][:2] + [60, 61, 62]
    rows = [prompt + c for c in completions]
    trie = assert_exact(rows)
    assert len(trie) == len(prompt) + len({tuple(c[: j + 1]) for c in completions for j in range(len(c))})
    assert all(m[: len(prompt)].tolist() == list(range(len(prompt))) for m in trie.rows)  # one copy of the prompt
    assert token_counts(["p"] * 8, rows) == {"row_tokens": 8 * 17, "tree_tokens": len(trie)}
    assert_packed_forward_equals_rows(rows)


def test_multi_turn_chain_is_one_path():
    rng = np.random.default_rng(1)
    prompt, rows = rng.integers(1, 64, 6).tolist(), []
    for _ in range(4):  # each turn's prompt: the last prompt, its reply and the opponent's message
        reply, message = rng.integers(1, 64, 3).tolist(), rng.integers(1, 64, 4).tolist()
        rows.append(prompt + reply)
        prompt = prompt + reply + message
    trie = assert_exact(rows)
    assert len(trie) == len(rows[-1]) and trie.positions.tolist() == list(range(len(rows[-1])))
    np.testing.assert_array_equal(trie.mask(), np.tril(np.ones((len(trie), len(trie)), bool)))  # plain causal
    assert token_counts(["a"] * 4, rows) == {"row_tokens": sum(map(len, rows)), "tree_tokens": len(rows[-1])}
    assert_packed_forward_equals_rows(rows)


def test_identical_rows_share_every_node():
    rows = [[3, 1, 4, 1, 5]] * 3 + [[3, 1, 4]]
    trie = assert_exact(rows)
    assert len(trie) == 5 and all(m.tolist() == [0, 1, 2, 3, 4] for m in trie.rows[:3])
    assert trie.rows[3].tolist() == [0, 1, 2]
    assert_packed_forward_equals_rows(rows)


def test_empty_completion_and_empty_row():
    prompt = [7, 8, 9]
    rows = [prompt + [], prompt + [1, 2], [], [7, 3]]
    trie = assert_exact(rows)
    assert trie.rows[0].tolist() == trie.rows[1][:3].tolist() and trie.rows[2].size == 0
    # the loss's view: rows 0, 1 and 3 with completions from 3, 3 and 1 (the empty row has none)
    pred, tgt, row = completion_targets(PackedTrie(trie.tokens, trie.positions, trie.parent, trie.tin, trie.tout,
                                                   (trie.rows[0], trie.rows[1], trie.rows[3])), [3, 3, 1])
    assert row.tolist() == [1, 1, 2]  # the empty completion reads nothing
    assert trie.tokens[pred].tolist() == [9, 1, 7] and tgt.tolist() == [1, 2, 3]
    assert_packed_forward_equals_rows(rows)
    assert len(pack([])) == 0 and trie_size([[]]) == 0


def test_completion_targets_read_each_rows_own_next_token():
    rows = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6]]
    trie = pack(rows)
    pred, tgt, row = completion_targets(trie, [3, 3, 2])
    for r, start in enumerate([3, 3, 2]):  # the token before each target, on the row's own path
        sel = row == r
        assert trie.tokens[pred[sel]].tolist() == rows[r][start - 1: -1] and tgt[sel].tolist() == rows[r][start:]
        assert trie.positions[pred[sel]].tolist() == list(range(start - 1, len(rows[r]) - 1))
    assert pred.tolist()[:2] == [2, 2]  # rows 0 and 1 read their targets 4 and 5 from the one shared "3"
    with pytest.raises(ValueError, match="needs a token before it"):
        completion_targets(trie, [0, 3, 2])


@pytest.mark.parametrize("seed", range(25))
def test_random_rows_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    stems = [rng.integers(0, 4, rng.integers(0, 6)).tolist() for _ in range(3)]
    rows = [stems[rng.integers(3)] + rng.integers(0, 3, rng.integers(0, 5)).tolist()
            for _ in range(rng.integers(1, 12))]
    assert_exact(rows)
    if seed < 5:
        assert_packed_forward_equals_rows(rows)


def test_players_never_share_a_trie():
    rows = [[1, 2, 3], [1, 2, 3], [1, 2, 4], [9]]
    players = ["a", "b", "a", "b"]
    tries = pack_players(players, rows)
    assert {p: idx for p, (_, idx) in tries.items()} == {"a": [0, 2], "b": [1, 3]}
    for p, (trie, idx) in tries.items():
        check_packing(trie, [rows[i] for i in idx])
    assert len(tries["a"][0]) == 4 and len(tries["b"][0]) == 4
    assert token_counts(players, rows) == {"row_tokens": 10, "tree_tokens": 8}
    assert token_counts(["a"] * 4, rows) == {"row_tokens": 10, "tree_tokens": 5}
    with pytest.raises(ValueError, match="one player per row"):
        pack_players(["a"], rows)


def test_the_checks_catch_a_wrong_mask_positions_or_row_map():
    rows = [[5, 6, 7, 9], [5, 6, 8, 9], [5, 4]]
    trie = pack(rows)
    check_packing(trie, rows)
    wrong = {
        "positions": dict(positions=np.arange(len(trie))),  # the packed index instead of the depth
        "tout": dict(tout=np.full(len(trie), len(trie))),  # everything sees everything before it
        "rows": dict(rows=(trie.rows[1], trie.rows[0], trie.rows[2])),
        "parent": dict(parent=np.where(trie.parent >= 0, 0, -1)),
    }
    for name, change in wrong.items():
        bad = PackedTrie(**{**trie.__dict__, **change})
        with pytest.raises(ValueError):
            check_packing(bad, rows)
    leaky = trie.mask().copy()
    eight, seven = int(trie.rows[1][2]), int(trie.rows[0][2])
    leaky[eight, seven] = True  # "8" seeing "7", its sibling
    with pytest.raises(ValueError, match=f"token {eight} sees token {seven}"):
        check_ancestor_mask(leaky, trie.parent)
    causal = np.tril(np.ones((len(trie), len(trie)), bool))  # per-row causal over the packing: wrong
    with pytest.raises(ValueError):
        check_ancestor_mask(causal, trie.parent)
    # and the forward notices too: with a plain causal mask or packed indices as positions, rows change
    packed = attention_outputs(trie.tokens, np.arange(len(trie)), trie.mask())
    alone = attention_outputs(rows[1], np.arange(4), np.tril(np.ones((4, 4), bool)))
    assert not np.allclose(packed[trie.rows[1]], alone)
    packed = attention_outputs(trie.tokens, trie.positions, causal)
    assert not np.allclose(packed[trie.rows[1]], alone)


# ---------------------------------------------------------------------- the update's accounting
def test_every_update_step_reports_row_and_tree_tokens(tiny_model_path):
    """``row_tokens`` / ``tree_tokens`` / ``padded_tokens`` of a step are those of the rows it trains
    (zero-advantage rows skipped, each player's own trie), summed over ``steps_per_generation`` slices,
    and reach the round's metrics as update/*."""
    from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec
    from autocurricula.loop.config import GRPOConfig
    from autocurricula.loop.rounds import update_metrics
    from autocurricula.records import Turn
    from autocurricula.training import Updater

    engine = Engine(str(tiny_model_path), config=EngineConfig(max_slots=4, initial_rank=2))
    try:
        spec = LoraSpec(r=2, lora_alpha=4, target_modules=["q_proj"])
        dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}
        for i, name in enumerate(["a", "b"]):
            engine.load_adapter(name, AdapterWeights.random(dims, spec, seed=i))
        prompt, turns = [5, 6, 7, 8, 9], []
        for g, completion in enumerate([[10, 11], [10, 12], [13, 14], [10, 11]]):  # a's GRPO group of 4
            turns.append(Turn("a", f"g{g}", "X", prompt, completion, [-2.0] * 2, reward=0.0, advantage=1.0 - g % 2))
        chain = [5, 6]
        for k in range(3):  # b's chain: each prompt the last prompt, its reply and a message
            turns.append(Turn("b", "c", "O", list(chain), [20 + k, 30], [-2.0] * 2, reward=0.0, advantage=1.0))
            chain += [20 + k, 30, 40 + k]
        turns.append(Turn("b", "d", "O", [5, 6, 7, 8, 9], [10, 11], [-2.0] * 2, reward=0.0, advantage=1.0))
        out = Updater(engine, GRPOConfig(learning_rate=1e-4)).step(turns)
        kept_a = [t for t in turns if t.player == "a" and t.advantage]  # g1 and g3 have advantage 0: skipped
        rows = [t.prompt_ids + t.completion_ids for t in turns if t.advantage]
        assert out["rows"] == len(rows) == 6
        assert out["row_tokens"] == sum(map(len, rows))
        # a: the prompt once, then "10 11" and "13 14"; b: its chain's last row, and game d's row after
        # the "5 6" it shares with the chain
        assert out["tree_tokens"] == (5 + 2 + 2) + (len(chain) - 1 + 5) == trie_size(
            [t.prompt_ids + t.completion_ids for t in kept_a]) + trie_size(rows[2:])
        assert out["padded_tokens"] >= out["computed_tokens"]  # padding on top of the tries' tokens
        sliced = Updater(engine, GRPOConfig(learning_rate=1e-4, steps_per_generation=2)).step(turns)
        assert sliced["row_tokens"] == out["row_tokens"] and sliced["tree_tokens"] >= out["tree_tokens"]
        logged = update_metrics(out, 0.5, {})
        assert logged["update/row_tokens"] == out["row_tokens"] and logged["update/tree_tokens"] == out["tree_tokens"]
        # the default packing computed the tries' tokens (one trie per player here: the rows fit its cap)
        assert out["computed_tokens"] == out["tree_tokens"] == logged["update/tokens"]
        assert logged["update/tree_ratio"] == pytest.approx(out["computed_tokens"] / out["row_tokens"])
        rows_out = Updater(engine, GRPOConfig(learning_rate=1e-4, packing="rows")).step(turns)
        assert rows_out["computed_tokens"] == out["row_tokens"] - out["rows"]
        assert logged["update/padded_tokens"] == out["padded_tokens"]
        assert "update/tree_ratio" not in update_metrics({"players": 0, "rows": 0}, 0.1, {})
    finally:
        engine.close()
