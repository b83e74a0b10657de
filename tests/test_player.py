"""The Player type: specs are dicts whose keys are declared fields (an unknown key is refused by
name), custom fields live under ``info`` or on a ``player_class``, players read like the seed's
dicts (``p["role"]``, ``x["epoch"]``) and by attribute, a misspelt key raises, and a checkpoint's
``players.json`` keeps every field."""

import json
from dataclasses import dataclass

import pytest

from autocurricula import AutocurriculumConfig, AutocurriculumTrainer, Player
from autocurricula.loop.pool import Pool, snapshot_spec
from autocurricula.records import PlayerKeyError, is_scripted

from league_doubles import FakeEngine, fake_pool
from toy_games import digits

KNOWN = ("id", "role", "epoch", "frozen", "parent", "version", "snapshot_of", "init", "resets", "policy", "adapter",
         "seat_role", "seat", "info")


@dataclass
class Rated(Player):
    """A player class of a league's own: every player has a skill."""

    skill: int = 0


def pool_of(player_class=Player) -> Pool:
    import numpy as np

    from autocurricula.engine import LoraSpec

    return Pool(FakeEngine(), LoraSpec(r=2, lora_alpha=4, target_modules=["q_proj"]), np.random.default_rng(0),
                player_class)


def policy(prompt):
    return "1"


def sync_digits(players, model, tokenizer):
    """``digits`` in the seed's synchronous dialect: ``model.generate(player, prompt)`` with a Player,
    each a copy of the pool's player with its seat."""
    assert [(type(p), p["seat"], p.seat) for p in players] == [(Rated, 0, 0), (Rated, 1, 1)]
    got = [model.generate(p, "Say a digit:", max_tokens=2).text for p in players]
    return [0.0, 0.0] if got[0] == got[1] else [1.0, -1.0] if got[0] > got[1] else [-1.0, 1.0]


def test_a_spec_with_an_unknown_key_is_refused_by_name_with_the_known_keys_and_the_fix():
    pool = fake_pool()
    with pytest.raises(ValueError) as err:
        pool.add({"role": "generator", "skill": 3}, 0)
    msg = str(err.value)
    assert "'skill'" in msg and all(k in msg for k in KNOWN)  # the key, and every key a spec may have
    assert "'info'" in msg and "player_class" in msg  # and where a field of your own goes
    assert pool.players == [] and pool.engine.adapters == {}  # refused before anything was made
    with pytest.raises(ValueError, match="'snapshotof'"):  # a misspelt framework key too
        pool.add_all([{"role": "main"}, {"role": "main", "frozen": True, "snapshotof": "main-0"}], 0)
    # a player_class declares the key: the same spec is accepted
    assert pool_of(Rated).add({"role": "generator", "skill": 3}, 0).skill == 3


def test_info_and_a_player_class_carry_custom_fields_into_players_and_snapshots():
    pool = fake_pool()
    g = pool.add({"role": "generator", "info": {"skill": 3, "tags": ["a"]}}, 0)
    assert type(g) is Player and g.info == {"skill": 3, "tags": ["a"]} and g["info"]["skill"] == 3
    snap = pool.add(snapshot_spec(g), 0)
    assert snap.info == {"skill": 3, "tags": ["a"]} and snap.info is not g.info  # a copy, not the same dict
    assert (snap.frozen, snap.snapshot_of, snap.parent) == (True, g.id, g.id)

    rated = pool_of(Rated)
    a = rated.add({"role": "generator", "skill": 5}, 0)
    b = rated.add({"role": "discriminator"}, 0)
    assert type(a) is Rated and (a.skill, a["skill"], b.skill) == (5, 5, 0)
    assert rated.add(snapshot_spec(a), 1).skill == 5  # a snapshot keeps the declared field
    b.skill = 2  # declared: writable by attribute and by key
    b["skill"] += 1
    assert b.skill == 3
    with pytest.raises(AttributeError, match="'skil'.*skill"):
        b.skil = 1


def test_a_trainer_player_class_is_what_its_pool_makes_and_what_a_seed_style_match_reads(tiny_model_path, tmp_path):
    """The seed README's fictitious GAN, reading players as dicts (``e["role"]``, ``x["epoch"]``), with
    declared fields of its own, playing a synchronous game; a resumed run gets them back from the
    checkpoint."""
    seen = []

    class GAN(AutocurriculumTrainer):
        player_class = Rated

        def entry(self):
            return [{"role": "generator", "skill": self.current_epoch + 1},
                    {"role": "discriminator", "info": {"epoch_joined": self.current_epoch}}]

        def match(self):
            gs = [e for e in self.players if e["role"] == "generator"]
            latest_g = sorted(gs, key=lambda x: x["epoch"])[-1]
            ds = [e for e in self.players if e["role"] == "discriminator"]
            latest_d = sorted(ds, key=lambda x: x["epoch"])[-1]
            seen.append((latest_g["id"], latest_g["skill"], latest_d.get("info")))
            return [(latest_g, d) for d in ds] + [(latest_d, g) for g in gs]

    cfg = dict(epochs=2, rounds=1, matches=1, output_dir=str(tmp_path), progress=False, max_tokens=2,
               ratings={"bt_bootstrap": 0})
    t = GAN(AutocurriculumConfig(**cfg))
    t.train(str(tiny_model_path), sync_digits)
    assert len(t.match_history) == 2 + 4  # every game played: epoch 0 one pair each way, epoch 1 four
    assert seen == [("generator-0", 1, {"epoch_joined": 0}), ("generator-1", 2, {"epoch_joined": 1})]
    assert all(type(p) is Rated and "seat" not in p for p in t.players)  # the pool's own are never seated
    saved = json.loads((tmp_path / "checkpoint-1" / "players.json").read_text())
    assert [(q["id"], q["skill"], q["epoch"]) for q in saved if q["role"] == "generator"] == [
        ("generator-0", 1, 0), ("generator-1", 2, 1)]
    t.engine.close()

    again = GAN(AutocurriculumConfig(**cfg))
    again.train(str(tiny_model_path), digits, resume_from_checkpoint=True)  # all epochs done: loads only
    assert [type(p) for p in again.players] == [Rated] * 4
    assert [dict(p) for p in again.players] == [dict(p) for p in t.players]
    again.engine.close()

    class Undeclared(AutocurriculumTrainer):
        player_class = dict
    with pytest.raises(TypeError, match="player_class must be Player"):
        Undeclared()

    @dataclass
    class ByValue(Player):  # equal by its fields, unhashable
        skill: int = 0

        def __eq__(self, other):
            return dict(self) == dict(other)

    class Compares(AutocurriculumTrainer):
        player_class = ByValue
    with pytest.raises(TypeError, match="ByValue defines __eq__"):
        Compares()

    class Loose(Player):  # fields that are no dataclass fields
        skill: int = 0

    class Undecorated(AutocurriculumTrainer):
        player_class = Loose
    with pytest.raises(TypeError, match="decorate it with @dataclass"):
        Undecorated()


def test_players_read_like_the_seed_dicts_and_by_attribute():
    pool = fake_pool()
    main = pool.add({"role": "main"}, 3)
    bot = pool.add({"id": "bot", "role": "bot", "policy": policy}, 3)
    snap = pool.add(snapshot_spec(main), 4)
    # the keys a dict had, and only those
    assert dict(main) == {"id": "main-0", "role": "main", "epoch": 3, "frozen": False, "parent": None,
                          "version": 1}
    assert {**snap} == {"id": "main-1", "role": "main", "epoch": 4, "frozen": True, "parent": "main-0",
                        "version": 1, "snapshot_of": "main-0"}
    assert (main["role"], main.role, main["epoch"], main.epoch) == ("main", "main", 3, 3)
    assert ("policy" in bot, "policy" in main, is_scripted(bot), is_scripted(main)) == (True, False, True, False)
    assert "snapshot_of" in snap and "snapshot_of" not in main and main.get("snapshot_of", "none") == "none"
    assert main.get("adapter", main["id"]) == "main-0"  # the arena's read: unset is the default
    assert main["snapshot_of"] is None and main.snapshot_of is None  # a declared field always reads
    pool.reset(main)
    assert main["resets"] == main.get("resets", 0) == 1 and "resets" in main
    # identity: a player is equal only to itself, and keys a dict (a plain @dataclass subclass's too)
    twin = Player(**dict(main))
    assert twin != main and main == main and {main: 1, twin: 2}[main] == 1
    assert main in pool.players and twin not in pool.players
    a, b = Rated(id="r", skill=1), Rated(id="r", skill=1)
    assert a != b and len({a, b}) == 2
    assert repr(main) == "Player({'id': 'main-0', 'role': 'main', 'epoch': 3, 'frozen': False, 'parent': None, " \
                         "'version': 2, 'resets': 1})"  # the dict it reads as
    assert repr(a).startswith("Rated({'id': 'r'") and "'skill': 1" in repr(a)


@pytest.mark.parametrize("read", [lambda p: p["rol"], lambda p: p.get("rol"), lambda p: p.get("rol", "x"),
                                  lambda p: "rol" in p, lambda p: p.__setitem__("rol", 1)])
def test_a_misspelt_key_raises_naming_the_known_ones(read):
    p = Player(id="main-0", role="main")
    with pytest.raises(KeyError) as err:
        read(p)
    assert isinstance(err.value, PlayerKeyError)
    msg = str(err.value)
    assert "'rol'" in msg and all(k in msg for k in KNOWN)
    with pytest.raises(KeyError, match="skill"):  # a subclass lists its own fields too
        Rated(id="x")["skil"]


def test_a_checkpoint_round_trip_keeps_every_field():
    pool = pool_of(Rated)
    main = pool.add({"role": "main", "skill": 4, "info": {"note": [1, 2]}, "seat_role": "white"}, 0)
    pool.add({"role": "exploiter", "init": "base", "adapter": "shared"}, 0)
    pool.add({"id": "bot", "role": "bot", "policy": policy}, 1)
    pool.add(snapshot_spec(main), 2)
    pool.reset(main)
    registry = json.loads(json.dumps(pool.registry()))  # as players.json holds it
    assert registry[2] == {"id": "bot", "role": "bot", "epoch": 1, "frozen": True, "parent": None, "version": None,
                           "skill": 0, "scripted": "policy"}
    restored = pool_of(Rated)
    restored.restore(registry, policies={"bot": policy})
    assert [type(p) for p in restored.players] == [Rated] * 4
    for before, after in zip(pool.players, restored.players):
        assert {f: getattr(after, f) for f in (*KNOWN, "skill")} == {f: getattr(before, f) for f in (*KNOWN, "skill")}
    assert restored.get("bot").policy is policy
    assert restored.add({"role": "main", "init": "base"}, 3).id == "main-2"  # the id counters come back too

    # a players.json as 0.2 wrote it (the same format): it loads into Player objects
    old = [{"role": "main_agent", "id": "main_agent-0", "epoch": 0, "frozen": False, "parent": None, "version": 7},
           {"role": "main_agent", "frozen": True, "parent": "main_agent-0", "snapshot_of": "main_agent-0",
            "id": "main_agent-1", "epoch": 0, "version": 1, "resets": 1}]
    plain = fake_pool()
    plain.restore(old)
    assert [dict(p) for p in plain.players] == old
    assert plain.registry() == old
    with pytest.raises(ValueError, match="'skill'.*player_class"):  # a field the trainer no longer declares
        fake_pool().restore(registry, policies={"bot": policy})
