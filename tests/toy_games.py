"""Tiny games for trainer tests (importable from a subprocess too)."""


async def digits(players, model, tokenizer):
    """Each player says something; the lexicographically larger reply wins. A non-trainable
    judge call is made too."""
    got = []
    for p in players:
        g = await model.generate(p, "Say a digit:", max_tokens=2)
        got.append(g.text)
    await model.generate(players[0], "judge: who won?", max_tokens=2, trainable=False)
    if got[0] == got[1]:
        return [0.0, 0.0]
    return [1.0, -1.0] if got[0] > got[1] else [-1.0, 1.0]


def seed_style(players, model, tokenizer):
    """The original autocurricula README's toy, verbatim apart from the import."""
    from autocurricula import set_player

    prompt = " "
    prompt_ids = tokenizer(prompt, return_tensors="pt")
    strs = []
    for player in players:
        set_player(model, player)
        str_ids = model.generate(**prompt_ids, do_sample=True, max_new_tokens=3)[0]
        strs += [tokenizer.decode(str_ids)]
    experiences = [{"thoughts": [{"context": prompt, "behavior": s}], "action": s} for s in strs]
    rewards = (strs[0] > strs[1], strs[0] < strs[1])
    return [rewards], [experiences]


def first_digit_policy(prompt, rng):
    return str(int(rng.integers(0, 10)))


async def nested(players, model, tokenizer):
    """A game of two sub-games (nested play): their turns carry level 1 and a parent."""
    a = await model.play(digits, players)
    b = await model.play(digits, players[::-1])
    total = a[0] + b[1]
    return [total, -total]
