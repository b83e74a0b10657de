"""Multi-turn games keep each seat's prompts byte-stable across turns (issue 67, item 5): a turn's
prompt ids extend that seat's previous prompt ids and completion ids, token for token, so a prefix
trie of the round (and the engine's prefix cache) sees one chain per conversation.

The games run through the real :class:`~autocurricula.arena.arena.Arena` and the tiny model's
tokenizer and chat template; only sampling is scripted: a learner's reply is a legal move (the
game's random policy) or a canned argument, written as the model would write it (then the stop
string, or the end-of-sequence token) but spelt one character per token. A game that decodes a
reply and encodes it again, inside a longer text, gets other ids than those, and the test sees it.
"""

from __future__ import annotations

import asyncio
import functools
import types
from concurrent.futures import Future

import pytest

from autocurricula.arena.arena import Arena
from autocurricula.games import debate, kuhn_poker, leduc_poker, negotiation, refine, tictactoe
from autocurricula.records import GameRecord


class ScriptedSampler:
    """The arena's engine: the tiny model's tokenizer and template, and replies from ``reply(text)``."""

    def __init__(self, engine, reply):
        self.engine, self.reply = engine, reply
        self.tokenizer = engine.tokenizer
        self.encode, self.decode, self.apply_chat_template = engine.encode, engine.decode, engine.apply_chat_template
        self.hf = getattr(engine.tokenizer, "_tokenizer", engine.tokenizer)

    def spelt(self, text: str) -> list[int]:
        """``text`` one character per token: decodes to ``text``, yet not the tokenizer's own ids."""
        return [t for ch in text for t in self.hf.encode(ch, add_special_tokens=False)]

    def submit_many(self, requests):
        return [self.submit(*r) for r in requests]

    def submit(self, ids, adapter, params):
        text = self.reply(self.decode(ids)) if adapter is not None else "A"  # the base model judges
        if params.stop:  # written up to the stop string, which ends the text
            token_ids = self.spelt(text + params.stop[0])
        else:
            token_ids = self.spelt(text) + [self.hf.eos_token_id]
        fut = Future()
        fut.set_result(types.SimpleNamespace(text=text, token_ids=token_ids, logprobs=[-1.0] * len(token_ids),
                                             prompt_ids=list(ids), finish_reason="stop", adapter_version=1))
        return fut


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_path):
    from autocurricula.engine import Engine

    engine = Engine(str(tiny_model_path))
    yield engine
    engine.close()


def play_games(engine, play, reply, n=4, players=("a", "b")):
    seats = [{"id": p} for p in players]
    arena = Arena(ScriptedSampler(engine, reply), seed=0, lockstep=False)
    records = asyncio.run(arena.run([(play, seats, GameRecord(f"g{i}", seats), "game") for i in range(n)]))
    for r in records:
        assert r.error is None, r.traceback
    return records


def conversations(records):
    """Each seat's turns in order, per (sub-)game."""
    out: dict = {}
    for r in records:
        for t in r.turns:
            out.setdefault((r.game_id, t.game_id, t.player, t.seat), []).append(t)
    return [ts for ts in out.values()]


def chain_breaks(records, special=frozenset()) -> list[str]:
    """Where a seat's turn fails to extend its previous prompt and completion token for token (a
    final special token of the completion may be left out), and how many turns followed another."""
    breaks, links = [], 0
    for turns in conversations(records):
        for prev, cur in zip(turns, turns[1:]):
            links += 1
            done = list(prev.completion_ids)
            ways = [prev.prompt_ids + done] + ([prev.prompt_ids + done[:-1]] if done and done[-1] in special else [])
            if not any(cur.prompt_ids[: len(w)] == w for w in ways):
                at = next((i for i, (x, y) in enumerate(zip(cur.prompt_ids, ways[0])) if x != y), len(cur.prompt_ids))
                breaks.append(f"{prev.game_id} {prev.player}: turn's prompt leaves the chain at token {at} of "
                              f"{len(ways[0])} (previous prompt {len(prev.prompt_ids)} tokens)")
    assert links, "no seat played two turns: nothing was checked"
    return breaks


def canned(text):
    return lambda prompt: text


def policy_of(module):
    return lambda prompt: module.random_policy(prompt, None)


CHAINED = {  # games whose seats speak in one growing conversation
    "debate": (functools.partial(debate.play, exchanges=3), canned("It is clearly true for most people.")),
    "debate-chat": (functools.partial(debate.play, exchanges=3, chat=True), canned("Think of the costs first.")),
    "refine": (functools.partial(refine.play, rounds=3), canned("A small cat naps in the warm sun.")),
    "refine-chat": (functools.partial(refine.play, rounds=3, chat=True), canned("Make it shorter.")),
}


@pytest.mark.parametrize("name", list(CHAINED))
def test_conversation_games_extend_each_seats_prompt_token_for_token(name, tiny_engine):
    play, reply = CHAINED[name]
    records = play_games(tiny_engine, play, reply)
    special = frozenset(getattr(tiny_engine.tokenizer, "_tokenizer", tiny_engine.tokenizer).all_special_ids)
    assert chain_breaks(records, special) == []
    if name.endswith("chat"):  # the end-of-turn token the reply stopped on stays in the chain where it is ChatML's
        assert all(t.prompt_ids[0] == 1 for r in records for t in r.turns)  # <|im_start|>


# Board games and negotiation show the position each turn, as the game's observation: the prompt is the
# state, not the conversation (Q / value credit key their tables on it, the exact evaluators and the
# warm-up render it, branch credit lists moves from it). Their prompts cannot extend each other without
# changing what a player is shown; the trie still shares each seat's rules and instructions.
STATE_PROMPTS = {
    "tictactoe-chat": (functools.partial(tictactoe.play, chat=True), policy_of(tictactoe)),
    "kuhn_poker-chat": (functools.partial(kuhn_poker.play, chat=True), policy_of(kuhn_poker)),
    "leduc_poker-chat": (functools.partial(leduc_poker.play, chat=True), policy_of(leduc_poker)),
    "negotiation-chat": (functools.partial(negotiation.play, chat=True), policy_of(negotiation)),
    "negotiation": (negotiation.play, policy_of(negotiation)),
}


@pytest.mark.parametrize("name", list(STATE_PROMPTS))
def test_state_prompt_games_show_the_position_not_the_conversation(name, tiny_engine):
    play, reply = STATE_PROMPTS[name]
    records = play_games(tiny_engine, play, reply, n=16)
    breaks = chain_breaks(records)
    assert breaks, f"{name} now extends its prompts: move it to CHAINED (and docs/games.md)"
    if name.endswith("chat"):  # the system message (rules, reply format) is each seat's shared prefix
        system = tiny_engine.apply_chat_template([{"role": "system", "content": "x"}])[:3]
        assert all(t.prompt_ids[:3] == system for r in records for t in r.turns)


def test_textarena_keeps_the_history_but_writes_the_reply_its_own_way(tiny_engine):
    """TextArena's default wrappers hand each player the whole history as one text, in which the
    player's own reply appears as TextArena echoes it ("[Player 0] [4]"), not as it was sampled:
    the prompt extends the previous prompt, and leaves the chain at the reply."""
    pytest.importorskip("textarena")
    from autocurricula.games import textarena

    records = play_games(tiny_engine, functools.partial(textarena.play, env_id="TicTacToe-v0"),
                         policy_of(textarena), n=4)
    breaks = chain_breaks(records)
    assert breaks
    turns = [ts for ts in conversations(records) if len(ts) > 1]
    assert all(cur.prompt_ids[: len(prev.prompt_ids) - 1] == prev.prompt_ids[:-1]
               for ts in turns for prev, cur in zip(ts, ts[1:]))


def test_a_template_that_rewrites_history_falls_back_to_messages(tiny_engine, caplog):
    """A chat template that writes earlier messages differently once more follow (here: it drops
    earlier assistant messages, as some reasoning templates drop their thinking) cannot be extended
    token for token: the conversation goes as messages again, with one warning. With ChatML it goes
    as ids, the reply's sampled ids kept, and in plain text a final end-of-sequence token is left out."""
    from autocurricula.games._common import Conversation

    hf = getattr(tiny_engine.tokenizer, "_tokenizer", tiny_engine.tokenizer)
    first = tiny_engine.apply_chat_template([{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Task: T"}])
    sampled = ScriptedSampler(tiny_engine, None).spelt("Short.") + [hf.eos_token_id]
    reply = types.SimpleNamespace(text="Short.", prompt_ids=first, token_ids=sampled)

    good = Conversation("Be brief.", "Task: T", True, hf)
    good.add(reply, "Again:")
    assert good.prompt()[: len(first) + len(sampled)] == first + sampled  # <|im_end|> closes the reply
    assert tiny_engine.decode(good.prompt()).endswith("user\nAgain:\nassistant\n")

    class Forgetful:  # ChatML that keeps only the last assistant message's place, not its text
        def __getattr__(self, name):
            return getattr(hf, name)

        def apply_chat_template(self, messages, **kw):
            kept = [m if m["role"] != "assistant" else {**m, "content": ""} for m in messages]
            return hf.apply_chat_template(kept, **kw)

    bad = Conversation("Be brief.", "Task: T", True, Forgetful())
    with caplog.at_level("WARNING"):
        bad.add(reply, "Again:")
    assert bad.prompt() == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Task: T"},
                            {"role": "assistant", "content": "Short."}, {"role": "user", "content": "Again:"}]
    assert "writes earlier messages differently" in caplog.text

    plain_first = tiny_engine.encode("Be brief.\n\nTask: T")
    plain = Conversation("Be brief.", "Task: T", False, hf)
    plain.add(types.SimpleNamespace(text="Short.", prompt_ids=plain_first, token_ids=sampled), "Again:")
    assert plain.prompt() == plain_first + sampled[:-1] + hf.encode("\nAgain:", add_special_tokens=False)
    scripted = Conversation("Be brief.", "Task: T", False, hf)  # a scripted reply has text only
    scripted.add(types.SimpleNamespace(text="Short.", prompt_ids=plain_first, token_ids=[]), "Again:")
    assert tiny_engine.decode(scripted.prompt()) == "Be brief.\n\nTask: T" + "Short.\nAgain:"
    assert Conversation("I.", "T", False, hf).prompt() == "I.\n\nT"  # before any reply: the text
    untracked = Conversation("I.", "T", False)  # no tokenizer (a test double's handle): text, as before
    untracked.add(reply, "Again:")
    assert untracked.prompt() == "I.\n\nT Short.\nAgain:"
