"""Debate: two debaters argue a claim; a judge reads the transcript and names the winner.

Players: ``[first, second]``. A claim comes from ``claims`` (a built-in list by default), drawn
from the game's seed. One game holds two debates of that claim as nested games, with the sides
swapped: the first player argues *for* the claim (and speaks first) in debate 1 and *against* it in
debate 2. Position bias of the judge (always preferring the first speaker, say) therefore cancels
within a game. Each debate has ``exchanges`` rounds of one argument per side; the judge sees the
whole transcript and names "A" (the first speaker) or "B".

The judge is ``judge=None`` (the base model, no adapter), a player id or a player dict (e.g. a
frozen snapshot); it is never trained.

Rewards: per debate, the winner +1 and the loser -1 (0 / 0 when the verdict names neither); these
are the rewards of that debate's turns. The game's reward is the mean over the two debates
(zero-sum). An empty argument makes its author the offender of ``invalid_penalty`` for the game
(and for the debate where it happened).

Each debater's prompts are one growing conversation (:class:`~autocurricula.games._common.Conversation`):
the claim and the debater's side first, then the transcript as it grows, each turn's prompt that
debater's previous prompt, its own argument as it wrote it, the other side's next argument and its
own header. Through the arena the prompts are token ids that extend each other token for token.
"""

from __future__ import annotations

from typing import Any

from autocurricula.arena.arena import GameResult
from autocurricula.games._common import (DEFAULT_INVALID_PENALTY, Conversation, check_penalty, check_players, choice,
                                         invalid_rewards, make_rng, say, text_of)
from autocurricula.games._tasks import prompt, verdict
from autocurricula.records import GameFacts

__all__ = ["CLAIMS", "FACTS", "NUM_PLAYERS", "ZERO_SUM", "debate", "play", "random_policy"]

NUM_PLAYERS = 2
ZERO_SUM = True
# the mean over two debates of +-1; a random claim
FACTS = GameFacts(2, "zero_sum", "perfect", "sequential", chance=True, payoff_range=(-1.0, 1.0))
CLAIMS = ["Cats make better pets than dogs.", "Homework should be banned.", "Cities should ban cars downtown.",
          "Space exploration is worth its cost.", "Everyone should learn to cook.", "Summer is the best season."]
DEBATER = "You are in a debate. Argue your side of the claim in one or two short sentences."
JUDGE = "You judge a debate. Read it and name the debater who argued better: answer A or B."


def random_policy(prompt_text: Any, rng: Any = None) -> str:
    """Scripted debater: a canned argument."""
    return choice(rng, ["It is clearly true for most people.", "The evidence points the other way.",
                        "Think of the costs first.", "History shows it works.", "Nobody has shown any harm."])


async def debate(players, model, tokenizer=None, *, claim: str, exchanges: int, judge, chat: bool,
                 max_tokens: int, temperature, penalty):
    """One debate (a nested game): ``players[0]`` argues for the claim as A, ``players[1]`` against as B.
    Each debater's conversation: the claim and its side, then every argument since its last one and
    its own header (``Debater A (for):``)."""
    transcript: list[str] = []
    talks: list[Conversation | None] = [None, None]
    heard, last = [0, 0], [None, None]  # per seat: transcript lines it has been shown, its last reply
    for _ in range(exchanges):
        for seat, (label, side) in enumerate((("A", "for"), ("B", "against"))):
            header = f"Debater {label} ({side}):"
            message = "\n".join([*transcript[heard[seat]:], header])
            if talks[seat] is None:
                talks[seat] = Conversation(DEBATER, f"Claim: {claim}\nYou are debater {label}, arguing {side} the "
                                                    f"claim.\n{message}", chat, tokenizer)
            else:
                talks[seat].add(last[seat], message)
            heard[seat] = len(transcript) + 1  # its own line follows
            last[seat] = await say(model, players[seat], talks[seat].prompt(), max_tokens=max_tokens,
                                   temperature=temperature, stop=("\n",))
            text = text_of(last[seat])
            if not text.strip():
                return GameResult(invalid_rewards(2, [seat], penalty), {"invalid": seat})
            transcript.append(f"{header} {text.strip()}")
    body = "\n".join([f"Claim: {claim}", *transcript, "Who argued better, A or B?", "Winner:"])
    reply = await model.judge(prompt(JUDGE, body, chat), player=judge, max_tokens=3, temperature=0.0)
    winner = verdict(getattr(reply, "text", str(reply)))
    rewards = [0.0, 0.0] if winner is None else [1.0, -1.0] if winner == "A" else [-1.0, 1.0]
    return GameResult(rewards, {"invalid": None, "winner": winner, "transcript": transcript})


async def play(players: list[dict], model, tokenizer=None, *, claims=None, judge=None, exchanges: int = 1,
               chat: bool = False, max_tokens: int = 48, temperature: float | None = None,
               invalid_penalty=DEFAULT_INVALID_PENALTY, seed: int | None = None, rng: Any = None) -> GameResult:
    """Two debates of one claim with the sides swapped; see the module docstring."""
    check_players(players, 2, "debate")
    penalty = check_penalty(invalid_penalty)
    if exchanges < 1:
        raise ValueError(f"exchanges must be at least 1, got {exchanges}")
    rng = make_rng(seed if seed is not None else getattr(model, "seed", None), rng)
    claim = choice(rng, claims or CLAIMS)
    totals, winners = [0.0, 0.0], []
    for order in ((0, 1), (1, 0)):  # one call site: the two debates are siblings for GRPO
        seated = [players[i] for i in order]
        result = await model.play(debate, seated, claim=claim, exchanges=exchanges, judge=judge, chat=chat,
                                  max_tokens=max_tokens, temperature=temperature, penalty=penalty)
        if result.extras["invalid"] is not None:
            offender = order[result.extras["invalid"]]
            return GameResult(invalid_rewards(2, [offender], penalty), {"claim": claim, "invalid": offender})
        for seat, player_index in enumerate(order):
            totals[player_index] += result[seat] / 2
        winners.append(result.extras["winner"])
    return GameResult(totals, {"claim": claim, "winners": winners})
