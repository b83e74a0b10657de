"""Hub publishing through a mock transport: the calls made, the files uploaded, the card."""

import base64
import json

import pytest

huggingface_hub = pytest.importorskip("huggingface_hub")

from autocurricula.engine import AdapterWeights, LoraSpec  # noqa: E402
from autocurricula.hub import push_to_hub  # noqa: E402

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
