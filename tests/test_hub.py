"""Hub publishing through a mock transport: the calls made, the files uploaded, the card."""

import base64
import json

import pytest

huggingface_hub = pytest.importorskip("huggingface_hub")

from autocurricula.engine import AdapterWeights, LoraSpec  # noqa: E402
from autocurricula.publish.hub import push_to_hub  # noqa: E402

DIMS = {f"model.layers.{i}.self_attn.{m}": (256, 256) for i in range(4) for m in ("q_proj", "v_proj")}


def test_push_player_records_calls_and_valid_card(hub, tmp_path):
    calls, commits = hub
    w = AdapterWeights.random(DIMS, LoraSpec(r=8, lora_alpha=16), seed=0)
    url = push_to_hub(w, "me/league", "tiny/base", name="main-0", role="main_agent", parent="init", elo=1034.56,
                      games=120, path_in_repo="main-0", private=True, token="hf_test", revision="main",
                      endpoint="https://hub.test", num_model_layers=4)
    assert "commit" in url
    posts = [(m, p) for m, p, _ in calls if m == "POST"]
    assert ("POST", "/api/repos/create") in posts
    assert any("/api/models/me/league/preupload/main" in p for _, p in posts)
    assert any("/api/models/me/league/commit/main" in p for _, p in posts)
    files = {op["value"]["path"]: op["value"] for op in commits[0] if op.get("key") == "file"}
    assert set(files) == {"main-0/README.md", "main-0/adapter_config.json", "main-0/adapter_model.safetensors"}
    card_text = base64.b64decode(files["main-0/README.md"]["content"]).decode()
    card_file = tmp_path / "README.md"
    card_file.write_text(card_text)
    card = huggingface_hub.ModelCard.load(card_file)
    assert card.data.library_name == "peft" and card.data.base_model == "tiny/base"
    assert "main_agent" in card.text and "1034.6" in card.text and "120" in card.text
    config = json.loads(base64.b64decode(files["main-0/adapter_config.json"]["content"]))
    assert config["base_model_name_or_path"] == "tiny/base" and config["r"] == 8


@pytest.fixture()
def hub_answers():
    """huggingface_hub's HTTP client through a mock transport whose answer a test picks: a status
    code, or ``"offline"`` (the name does not resolve, as without network)."""
    from helpers import hub_transport

    answer = {"with": 200}

    def respond(request, httpx):
        if answer["with"] == "offline":
            raise httpx.ConnectError("[Errno -2] Name or service not known", request=request)
        return httpx.Response(answer["with"], json={"error": "no", "name": "me"})

    with hub_transport(respond):
        yield answer


@pytest.mark.parametrize("answer, cause", [("offline", r"no network: the Hub cannot be reached \(ConnectError"),
                                           (401, r"the Hub rejected the token \(401\)"),
                                           (403, r"the token may not write there \(403\)")])
def test_a_push_that_the_hub_refuses_names_the_repo_the_cause_and_the_login(hub_answers, answer, cause):
    from autocurricula.publish.hub import HubAccessError

    hub_answers["with"] = answer
    w = AdapterWeights.random(DIMS, LoraSpec(r=8, lora_alpha=16), seed=0)
    with pytest.raises(HubAccessError, match=rf"cannot create Hugging Face Hub repo 'me/league': {cause}") as info:
        push_to_hub(w, "me/league", "tiny/base", token="hf_test", endpoint="https://hub.test")
    if answer == 401:
        assert "`hf auth login`" in str(info.value) and "huggingface-cli" not in str(info.value)


def test_the_login_check_names_a_missing_token_and_the_login_command(hub_answers, monkeypatch, tmp_path):
    from autocurricula.publish.hub import HubAccessError, check_hub_access

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # no stored token either
    with pytest.raises(HubAccessError, match=r"'me/league'.*no Hugging Face token is set: log in with `hf auth login`"):
        check_hub_access("me/league", endpoint="https://hub.test")
    hub_answers["with"] = "offline"
    with pytest.raises(HubAccessError, match=r"'me/league'.*no network.*push_to_hub=False"):
        check_hub_access("me/league", token="hf_test", endpoint="https://hub.test")


def test_a_hub_id_that_cannot_be_fetched_names_the_id_and_the_offline_options(hub_answers, monkeypatch, tmp_path):
    from autocurricula.publish.hub import ModelNotFoundError, check_model_source

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))  # nothing cached
    hub_answers["with"] = "offline"
    assert check_model_source("someone/some-model") == "someone/some-model"  # no fetch asked: only checked
    with pytest.raises(ModelNotFoundError) as info:
        check_model_source("someone/some-model", fetch=True)
    text = str(info.value)
    assert "'someone/some-model' cannot be fetched" in text and "not in the Hugging Face cache" in text
    assert "local model folder" in text and "`autocurricula tiny-model PATH`" in text
    assert info.value.__cause__ is None and info.value.__suppress_context__  # one short message, no chain


def test_the_league_card_puts_the_deployable_mixture_beside_the_one_over_every_player(tmp_path):
    from types import SimpleNamespace

    from autocurricula.loop.config import RatingConfig
    from autocurricula.publish.hub import league_card
    from autocurricula.loop.rating import Elo, Payoff, RelativePayoff
    from autocurricula.loop.standings import Standings

    payoff, elo, relative = Payoff(), Elo(), RelativePayoff()
    for _ in range(20):  # the scripted minimax beats both adapters; main beats snap
        for a, b in (("minimax", "main"), ("minimax", "snap"), ("main", "snap")):
            payoff.update(a, b, "win")
            elo.update([a, b], [1, 0])
            relative.update_match([a, b], [1, -1])
    from autocurricula.records import Player

    players = [Player(id="main", role="main_agent", frozen=False, epoch=0),
               Player(id="snap", role="main_agent", frozen=True, epoch=0, parent="main"),
               Player(id="minimax", role="minimax", policy=lambda prompt: "5", frozen=True, epoch=0),
               Player(id="late", role="main_agent", frozen=True, epoch=1, parent="main")]
    standings = Standings(RatingConfig(bt_bootstrap=0), tmp_path, seed=0)
    standings.elo, standings.payoff, standings.relative = elo, payoff, relative
    board = standings.leaderboard(players)
    rows = {r["id"]: r for r in board.rows}
    assert rows["minimax"]["nash"] == pytest.approx(1.0) and rows["minimax"]["deploy"] == 0.0
    assert rows["main"]["deploy"] == pytest.approx(1.0) and rows["main"]["nash"] == pytest.approx(0.0)
    assert [r["id"] for r in board.rows][-1] == "late"  # no games: last, unrated
    text = str(board)
    assert "unrated" in text.splitlines()[-2] and text.splitlines()[-1].startswith("deploy: the meta-strategy over the")
    run = SimpleNamespace(pool=SimpleNamespace(players=players), standings=standings, model_name="/nowhere/tiny",
                          game_name="tictactoe")
    mixture = {r["id"]: r["deploy"] for r in board.rows if r.get("deploy")}
    card = league_card(run, board, mixture, {"seed": 0}, "LeagueTrainer", 1)
    assert "| deployable weight | Nash weight |" in card
    deployable = card.split("## Deployable mixture")[1].split("##")[0]
    meta = card.split("## Meta-strategy")[1].split("##")[0]
    assert "`main` 1.000" in deployable and "minimax" not in deployable
    assert "`minimax` 1.000" in meta and "scripted" in meta
    assert "| late | main_agent | 1 | True | unrated |" in card
