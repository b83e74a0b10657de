"""Publishing players to the Hugging Face Hub as peft adapters with model cards.

Uses ``huggingface_hub`` (``create_repo`` + ``upload_folder``; its own retries apply). Cards carry
the metadata the Hub indexes (``library_name: peft``, ``base_model``, tags) and, when a league
provides them, the player's role, parent, Elo and games played.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

from autocurricula.engine.adapters import AdapterWeights
from autocurricula.publish.export import export_peft
from autocurricula.publish.mixture import MIXTURE_FILE, MixtureError, check_weights, mixture_document, serve_command
from autocurricula.records import is_scripted


LOGIN = "`hf auth login` (or set HF_TOKEN)"
OFFLINE = ("a local model folder (for example one that `autocurricula tiny-model PATH` builds), or the id once "
           "its download is in the Hugging Face cache")


class ModelNotFoundError(FileNotFoundError):
    """A model that is neither an existing folder nor a Hub id that can be fetched."""


class HubAccessError(RuntimeError):
    """The Hub cannot be reached, logged in to, or written to; the message names the repo and why."""


def hub_failure_cause(exc: BaseException) -> str:
    """Why a Hub call failed, in words: no network, no token, a rejected token, or no permission."""
    from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError  # huggingface_hub: optional (extra hub)

    if isinstance(exc, LocalTokenNotFoundError):
        return f"no Hugging Face token is set: log in with {LOGIN}"
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        status = exc.response.status_code
        if status == 401:
            return f"the Hub rejected the token (401): log in again with {LOGIN}"
        if status == 403:
            return "the token may not write there (403): use a token with write access to it, or another repo id"
        return f"the Hub answered {status} ({exc})"
    # httpx's and httpx2's (huggingface_hub's client) failures to connect, time out or read
    if isinstance(exc, OSError) or any(c.__name__ == "TransportError" for c in type(exc).__mro__):
        return f"no network: the Hub cannot be reached ({type(exc).__name__}: {exc}); check the connection"
    return f"{type(exc).__name__}: {exc}"


def _hub_call(repo_id: str, doing: str, call):
    """``call()``, with any failure of the Hub turned into a :class:`HubAccessError` that names
    ``repo_id``, what was being done and why it failed."""
    try:
        return call()
    except HubAccessError:
        raise
    except Exception as exc:  # noqa: BLE001 - every Hub failure is named the same way
        raise HubAccessError(f"cannot {doing} Hugging Face Hub repo {repo_id!r}: {hub_failure_cause(exc)}") from exc


def _is_repo_id(text: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id  # huggingface_hub: optional (extra hub)

    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def check_model_source(model, *, fetch: bool = False) -> str:
    """``model`` as a string when it is an existing folder or could be a Hub id; otherwise a
    :class:`ModelNotFoundError` that says so (instead of huggingface_hub's validation traceback).

    ``fetch=True`` also downloads a Hub id into the Hugging Face cache now (the files ``mlx_lm.load``
    reads; a cached copy is used when the Hub cannot be reached), and when that fails raises a
    short :class:`ModelNotFoundError` naming the id and the offline options."""
    text = str(model)
    path = Path(text).expanduser()
    if path.exists():
        return str(path)
    if text.startswith(("/", ".", "~")) or not _is_repo_id(text):
        raise ModelNotFoundError(f"model {text!r}: no such folder, and not a Hub id; give an existing local model "
                                 "folder or a Hub id such as 'mlx-community/Qwen2.5-0.5B-Instruct-4bit'")
    if fetch:
        fetch_model(text)
    return text


def fetch_model(repo_id: str) -> Path:
    """The local folder of Hub model ``repo_id``, downloaded (or found in the cache) as ``mlx_lm.load``
    does; a :class:`ModelNotFoundError` without the download's traceback when it cannot be had."""
    # mlx_lm (it imports transformers) and huggingface_hub (extra hub): only when a model is fetched
    from mlx_lm.utils import _download  # the very download of mlx_lm.load, so the engine finds it cached

    try:
        return Path(_download(repo_id))
    except Exception as exc:  # noqa: BLE001 - no network, no such repo, gated: one message either way
        raise fetch_failure(repo_id, exc) from None


def fetch_failure(repo_id: str, exc: BaseException) -> ModelNotFoundError:
    """The :class:`ModelNotFoundError` for a download of Hub model ``repo_id`` that failed with
    ``exc``: the id, why (offline mode, no network, no such repo or a login needed) and the options."""
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    reason = hub_failure_cause(exc)
    if isinstance(exc, LocalEntryNotFoundError) and _offline_mode():  # asked not to reach the Hub
        reason = ("offline mode is on (HF_HUB_OFFLINE=1) and the model is not in the Hugging Face cache; "
                  "with a network, set HF_HUB_OFFLINE=0 to download it")
    elif isinstance(exc, LocalEntryNotFoundError):  # offline and not in the cache
        reason = "the Hub cannot be reached and the model is not in the Hugging Face cache"
    elif isinstance(exc, (RepositoryNotFoundError, GatedRepoError)):
        reason = f"no such model on the Hub, or it needs a login: check the id, or log in with {LOGIN}"
    return ModelNotFoundError(f"model {repo_id!r} cannot be fetched from the Hugging Face Hub: {reason}. "
                              f"Offline, pass {OFFLINE}")


def _offline_mode() -> bool:
    """huggingface_hub's offline mode (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE, as it read them)."""
    from huggingface_hub import constants  # huggingface_hub: optional (extra hub)

    is_offline = getattr(constants, "is_offline_mode", None)
    return bool(is_offline() if callable(is_offline) else getattr(constants, "HF_HUB_OFFLINE", False))


_CACHE_DIR = re.compile(r"models--([^/]+?)--([^/]+)/snapshots/[^/]+/?$")


def hub_base_model(model: str | None) -> str | None:
    """The Hub id of a base model when it is known: the id itself, a folder of the Hugging Face
    cache (``models--owner--name/snapshots/<rev>``), or a folder whose ``config.json`` names its Hub
    id in ``_name_or_path``; ``None`` for other local folders."""
    if not model:
        return None
    text = str(model)
    path = Path(text).expanduser()
    if not path.exists():
        return text if _is_repo_id(text) else None
    m = _CACHE_DIR.search(path.resolve().as_posix())
    if m:
        return f"{m.group(1)}/{m.group(2)}"
    try:
        name = json.loads((path / "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(name, str) and "/" in name and not Path(name).expanduser().exists() and _is_repo_id(name):
        return name
    return None


def check_hub_access(repo_id: str, *, private: bool = False, token: str | None = None,
                     endpoint: str | None = None) -> None:
    """Before training with ``push_to_hub=True``: the token is accepted (``whoami``) and the repo
    can be created (as ``transformers.Trainer`` does at start); a :class:`HubAccessError` otherwise."""
    from huggingface_hub import HfApi  # huggingface_hub: optional (extra hub)

    api = HfApi(endpoint=endpoint, token=token)
    try:
        user = api.whoami(token=token)
    except Exception as exc:  # noqa: BLE001 - no token, a rejected token or no connection
        raise HubAccessError(f"push_to_hub=True for Hugging Face Hub repo {repo_id!r}, but the Hub did not accept "
                             f"the login: {hub_failure_cause(exc)}. Log in with {LOGIN}, or set push_to_hub=False "
                             "(checked before training, so no training is lost)") from exc
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, token=token)
    except Exception as exc:  # noqa: BLE001
        who = user.get("name") if isinstance(user, dict) else None
        raise HubAccessError(f"push_to_hub=True, but Hugging Face Hub repo {repo_id!r} cannot be created or written"
                             f"{f' as {who}' if who else ''}: {hub_failure_cause(exc)}. Check hub_model_id, or set "
                             "push_to_hub=False") from exc


def model_card(name: str, base_model: str | None, *, role: str | None = None, parent: str | None = None,
               elo: float | None = None, games: int | None = None, epoch: int | None = None,
               extra_tags: list[str] | None = None) -> str:
    """README.md text with YAML metadata that ``huggingface_hub.ModelCard.load`` parses.
    ``base_model``: the base model's Hub id, or ``None`` when it is not on the Hub (left out)."""
    tags = ["autocurricula", "lora", "peft", "mlx", "self-play"] + list(extra_tags or [])
    meta = ["library_name: peft"] + ([f"base_model: {base_model}"] if base_model else [])
    meta += ["pipeline_tag: text-generation", "tags:"]
    meta += [f"- {t}" for t in tags]
    facts = {"role": role, "parent": parent, "elo": None if elo is None else round(float(elo), 1), "games played": games,
             "epoch": epoch}
    rows = "\n".join(f"| {k} | {v} |" for k, v in facts.items() if v is not None)
    table = f"\n| | |\n|---|---|\n{rows}\n" if rows else ""
    on_top = (f"on top of `{base_model}`." if base_model else
              "on top of a base model from a local folder that is not on the Hugging Face Hub, so this card "
              "names no `base_model`.")
    return ("---\n" + "\n".join(meta) + "\n---\n\n"
            f"# {name}\n\nA LoRA player trained with [autocurricula](https://pypi.org/project/autocurricula/) "
            f"{on_top}\n{table}\n"
            "## Use it\n\n```python\nfrom transformers import AutoModelForCausalLM\nfrom peft import PeftModel\n\n"
            f"base = AutoModelForCausalLM.from_pretrained(\"{base_model or '<the base model folder>'}\")\n"
            f"model = PeftModel.from_pretrained(base, \"<this repo>\")\n```\n")


def push_to_hub(weights: AdapterWeights, repo_id: str, base_model: str, *, name: str | None = None,
                role: str | None = None, parent: str | None = None, elo: float | None = None,
                games: int | None = None, epoch: int | None = None, path_in_repo: str | None = None,
                private: bool = False, token: str | None = None, revision: str | None = None,
                commit_message: str | None = None, use_rslora: bool = False, num_model_layers: int | None = None,
                endpoint: str | None = None) -> str:
    """Export ``weights`` as a peft adapter with its model card and upload it; returns the commit URL.

    ``path_in_repo`` puts the player in a folder (one repo, a folder per player)."""
    from huggingface_hub import HfApi  # huggingface_hub: optional (extra hub)

    api = HfApi(endpoint=endpoint, token=token)
    _hub_call(repo_id, "create", lambda: api.create_repo(repo_id, private=private, exist_ok=True, token=token))
    card = model_card(name or repo_id.split("/")[-1], hub_base_model(base_model), role=role, parent=parent, elo=elo,
                      games=games, epoch=epoch)
    with tempfile.TemporaryDirectory() as tmp:
        folder = export_peft(weights, Path(tmp) / "adapter", base_model, use_rslora=use_rslora,
                             num_model_layers=num_model_layers, readme=card)
        info = _hub_call(repo_id, "upload to", lambda: api.upload_folder(
            repo_id=repo_id, folder_path=str(folder), path_in_repo=path_in_repo, revision=revision, token=token,
            commit_message=commit_message or f"Upload {name or repo_id} (autocurricula)"))
    return str(info)


def league_card(run, leaderboard, mixture: dict, settings: dict, trainer_name: str, epochs: int,
                repo_id: str | None = None) -> str:
    """README.md of a league repo (``run``: a :class:`~autocurricula.loop.run.Run`): leaderboard, the
    deployable ``mixture`` (Nash over the players with an adapter) with the commands that serve it
    from ``repo_id`` (:func:`mixture_card`), beside the league's meta-strategy (Nash over every
    player), payoff matrix, lineage and the run's ``settings``."""
    rows = leaderboard.rows
    players = run.pool.players
    ids = [p.id for p in players]
    matrix = run.standings.payoff.matrix(ids)
    base = hub_base_model(run.model_name)
    lines = ["---", "library_name: peft"] + ([f"base_model: {base}"] if base else [])
    lines += ["tags:", "- autocurricula", "- lora", "- peft", "- self-play", "- league", "---", "",
              f"# League: {run.game_name}", "",
              f"{len(ids)} players of `{base or Path(str(run.model_name)).name}`"
              f"{'' if base else ' (a local base model, not on the Hub: no base_model in the metadata)'}"
              ", trained with autocurricula "
              f"(`{trainer_name}`, {epochs} epochs). Each player is a peft LoRA adapter "
              "in the folder named after it.", "", "## Leaderboard", "",
              "| rank | player | role | epoch | frozen | Elo | BT (95% CI) | games | deployable weight | Nash weight |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    nash = {r["id"]: r["nash"] for r in rows if r.get("nash") is not None}
    deploy = {pid: w for pid, w in mixture.items() if w}
    for r in rows:
        bt = "-" if r.get("bt") is None else f"{r['bt']:.0f} ({r['bt_low']:.0f}-{r['bt_high']:.0f})"
        elo = f"{r['elo']:.1f}" if r.get("games") else "unrated"
        lines.append(f"| {r['rank']} | {r['id']} | {r.get('role')} | {r.get('epoch')} | {r.get('frozen')} | "
                     f"{elo} | {bt} | {r.get('games')} | {deploy.get(r['id'], 0.0):.3f} | "
                     f"{nash.get(r['id'], 0.0):.3f} |")

    def listed(weights: dict) -> str:
        return ", ".join(f"`{pid}` {w:.3f}" for pid, w in sorted(weights.items(), key=lambda kv: -kv[1]) if w > 0) \
            or "-"

    lines += ["", "## Deployable mixture", "",
              "The league's meta-strategy over the players that have an adapter in this repo (the `deployable "
              "weight` column, `trainer.deployable_mixture()`): the mixture that holds its own best in the game of "
              "mean relative rewards between the players, each entry taken at the lower end of its confidence "
              "interval. To deploy the league, draw one of these adapters per game by these weights: "
              f"{listed(deploy)}. They are in `mixture.json`, as `trainer.export_mixture(folder)` writes them.", "",
              mixture_card(deploy, base, repo_id), "",
              "## Meta-strategy", "",
              "The same over the meta-game's players, scripted opponents included (the `Nash weight` column): it "
              "says where the league's strength lies, and it may weigh a scripted policy, which is no adapter: "
              f"{listed(nash)}."]
    lines += ["", "## Payoff matrix (win rate of row vs column)", "", "| | " + " | ".join(ids) + " |",
              "|---" * (len(ids) + 1) + "|"]
    lines += [f"| {a} | " + " | ".join(f"{v:.2f}" for v in row) + " |" for a, row in zip(ids, matrix)]
    lines += ["", "## Lineage", ""]
    lines += [f"- `{p.id}` ← `{p.parent or 'base'}`" + (" (frozen)" if p.frozen else "") for p in players]
    lines += ["", "## Config", "", "```json", json.dumps(settings, indent=1), "```", ""]
    return "\n".join(lines)


def mixture_card(mixture: dict, base_model: str | None, repo_id: str | None) -> str:
    """The card's "Serve it" section: this repo is a mixture folder (``mixture.json`` beside a folder
    per player), and the commands that download and serve it, or load it in Python. Without a
    playable mixture (:func:`~autocurricula.publish.mixture.check_weights`), a line that says so."""
    try:
        check_weights(mixture)
    except MixtureError as exc:
        return f"### Serve it\n\nNothing to serve yet: {exc}."
    repo = repo_id or "OWNER/REPO"
    name = repo.split("/")[-1]
    return "\n".join([
        "### Serve it", "",
        "This repo is a mixture folder: `mixture.json` beside one peft adapter folder per player. Served, it is one "
        "model of an OpenAI-compatible API; each new conversation draws its adapter by the weights above and keeps it "
        "for its later turns (send a session key: the `X-Session-Id` header, or the request's `user` field). The "
        "response's `model` and its `X-Autocurricula-Adapter` header name the adapter that played.", "",
        "```bash", f"hf download {repo} --local-dir {name}", serve_command(base_model, name, name), "```", "",
        "In Python, for your own games or an evaluation, draw one adapter per game:", "",
        "```python", "import autocurricula", "",
        f"mixture = autocurricula.load_mixture(\"{name}\", seed=0)  # checks mixture.json and every adapter",
        "player = mixture.draw()  # an adapter name, by the weights; mixture.adapter_folder(player) is its folder",
        "```", "", "autocurricula's docs/deploy.md shows more: one player in transformers, peft, mlx-lm or vLLM."])


def push_league(run, repo_id: str, leaderboard, card: str, mixture: dict, *, private: bool = False,
                token: str | None = None, revision: str | None = None, endpoint: str | None = None) -> str:
    """Stage every player of ``run`` (peft folder + card), the league ``card``, the deployable
    ``mixture``, match history and plots, and upload them in one commit; returns the commit URL."""
    from huggingface_hub import HfApi  # huggingface_hub: optional (extra hub)

    api = HfApi(endpoint=endpoint, token=token)
    _hub_call(repo_id, "create", lambda: api.create_repo(repo_id, private=private, exist_ok=True, token=token))
    elo = {r["id"]: r for r in leaderboard.rows}
    base = hub_base_model(run.model_name)
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        for p in run.pool.players:
            if is_scripted(p):
                continue
            row = elo.get(p.id, {})
            player_card = model_card(p.id, base, role=p.role, parent=p.parent or "base",
                                     elo=row.get("elo"), games=row.get("games"), epoch=p.epoch)
            export_peft(run.engine.adapter_weights(p.id), stage / p.id, base or run.model_name,
                        use_rslora=run.lora.use_rslora, readme=player_card)
        (stage / "README.md").write_text(card)
        (stage / MIXTURE_FILE).write_text(mixture_document(mixture, base or str(run.model_name), "peft",
                                                           getattr(run, "game_name", None)))
        out = Path(run.config.output_dir)
        for name in ("match_history.jsonl", "elo.png", "payoff.png"):
            if (out / name).is_file():
                shutil.copyfile(out / name, stage / name)
        info = _hub_call(repo_id, "upload to", lambda: api.upload_folder(
            repo_id=repo_id, folder_path=str(stage), revision=revision, token=token,
            commit_message=f"League of {len(run.pool.players)} players (autocurricula)"))
    return str(info)
