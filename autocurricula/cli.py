"""``autocurricula`` command line: train | serve | check-model | dashboard | tiny-model | env | bench.

Errors. A command that fails for a reason the user can act on prints one line (or a few) on
stderr, ``autocurricula COMMAND: what went wrong, and the fix``, and exits with status 1; no
traceback. ``autocurricula --debug COMMAND ...`` shows the traceback instead. Such a reason is
(:func:`user_error`):

- an error the project raises itself, whose message already names the problem and the fix
  (:data:`PROJECT_ERRORS`): no such model folder or Hub id, the Hub unreachable or offline
  (``ModelNotFoundError``, ``HubAccessError``), a model folder that cannot be loaded or a family
  the engine refuses (``ModelLoadError``, ``UnsupportedModelError``), a bad adapter or mixture
  folder (``AdapterError``, its ``MixtureError``, ``BaseModelMismatchError``), a broken checkpoint
  (``CheckpointError``), a game that keeps failing (``GameError``), a server that refuses or cannot
  be reached (``ServerError``), and the CLI's own :class:`UsageError` (settings or arguments that
  fail validation: the league config, ``grpo:`` and ``lora:`` sections, a YAML file that does not
  parse);
- anything raised while a model folder is read (mlx-lm's loader or the engine's): explained by
  :func:`autocurricula.publish.check_model.explain_load_error` (no config.json, weights that do not
  match the config, a missing config key, no tokenizer...);
- ``OSError``: files and folders the user named (missing, existing, not writable), ports in use;
- ``ModuleNotFoundError`` of an optional third-party package (an extra to install).

Anything else is a bug and keeps its traceback. ``check-model`` answers every model that does
not load with a table whose ``load`` row names the cause and the fix (exit status 1);
``--debug`` adds the traceback of each failed row.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import platform
import sys
import traceback
from pathlib import Path

import yaml

import autocurricula
from autocurricula.engine import blas as _blas

from autocurricula.bench import args as bench_args  # argparse and os only: the bench flags' ranges

DESCRIPTION = ("Train populations of LoRA players against each other. Commands: train, serve, check-model, dashboard, "
               "tiny-model, env, bench; `autocurricula COMMAND --help` for each.")

# module -> names of the exception classes the project raises for problems the user can fix; each
# message names the problem and what to do (see the module docstring). Looked up in sys.modules only:
# an exception of a class whose module was never imported cannot have been raised.
PROJECT_ERRORS = {
    "autocurricula.publish.hub": ("ModelNotFoundError", "HubAccessError"),
    "autocurricula.publish.check_model": ("ModelLoadError",),
    "autocurricula.engine.models": ("UnsupportedModelError",),
    "autocurricula.engine.adapters": ("AdapterError",),
    "autocurricula.engine.fingerprint": ("BaseModelMismatchError",),
    "autocurricula.loop.checkpoint": ("CheckpointError",),
    "autocurricula.loop.rounds": ("GameError",),
    "autocurricula.fleet.client": ("ServerError",),
}


class UsageError(Exception):
    """Arguments or settings of a command that cannot work; the message names them and the fix."""


def _project_error_types() -> tuple[type, ...]:
    types: list[type] = [UsageError]
    for module, names in PROJECT_ERRORS.items():
        mod = sys.modules.get(module)
        types += [getattr(mod, n) for n in names if isinstance(getattr(mod, n, None), type)]
    return tuple(types)


def user_error(exc: BaseException, model=None) -> str | None:
    """The message for ``exc`` when it is a problem the user can fix (module docstring), else None
    (a bug: its traceback is shown). ``model``: the command's model, named by load failures."""
    if isinstance(exc, _project_error_types()):
        return str(exc)
    if model is not None and ("mlx_lm" in sys.modules or "autocurricula.engine.models" in sys.modules):
        import autocurricula.publish.check_model as check  # a model loader ran: its failures are explained

        if check.raised_while_loading(exc):
            return str(check.explain_load_error(exc, model))
    if isinstance(exc, OSError):
        return str(exc) or type(exc).__name__
    if isinstance(exc, ModuleNotFoundError) and exc.name and not exc.name.startswith("autocurricula"):
        return (f"this command needs the package {exc.name!r}, which is not installed: install it (pip install "
                f"{exc.name.split('.')[0]}, or the extra that brings it: 'autocurricula[hf]', '[hub]', '[ray]'...; "
                "docs/install.md)")
    return None


def _env(args) -> None:
    # each subcommand imports what it runs (mlx, torch, the server): `autocurricula --help` stays fast
    from autocurricula.bench.engine import gemm_ceiling  # mlx
    from autocurricula.engine.cpu_kernels import describe as describe_cpu_paths  # mlx

    import mlx.core as mx

    info = {"autocurricula": autocurricula.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "mlx": mx.__version__, "device": str(mx.default_device()),
            "blas": _blas.describe(), "gemm_gflops": round(gemm_ceiling(sizes=(1024,), seconds=0.3) / 1e9, 1),
            "cpu_paths": describe_cpu_paths()}
    for mod in ("mlx_lm", "transformers", "peft", "trl", "torch"):
        try:
            info[mod] = __import__(mod).__version__
        except ImportError:
            info[mod] = None
    print(json.dumps(info, indent=2) if args.json else "\n".join(f"{k:<14} {v}" for k, v in info.items()))


def _tiny(args) -> None:
    from autocurricula.engine.tiny import build_tiny_model  # tokenizers

    try:
        path = build_tiny_model(args.path, model_type=args.model_type, hidden_size=args.hidden,
                                num_layers=args.layers, vocab_size=args.vocab, quantize_bits=args.quantize_bits,
                                overwrite=args.overwrite)
    except ValueError as exc:  # the sizes: hidden / heads, vocabulary, quantization
        raise UsageError(f"{exc}; change --hidden, --layers, --vocab or --quantize-bits") from exc
    print(path)


def _adapter_args(items: list[str] | None, flag: str = "--adapter",
                  what: str = "a peft or mlx-lm adapter folder") -> dict[str, str]:
    """``--adapter name=folder`` (repeatable; or ``flag``, whose folder is ``what``) as ``{name: folder}``."""
    out = {}
    for item in items or []:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            raise SystemExit(f"autocurricula serve: {flag} {item!r}: write it as NAME=FOLDER ({what})")
        if name in out:
            raise SystemExit(f"autocurricula serve: {flag} {name} is given twice")
        out[name] = folder
    return out


def _mixture_args(items: list[str] | None, adapters: dict[str, str]) -> dict[str, str]:
    """``--mixture name=folder`` (repeatable) as ``{name: folder}``, each folder checked now (before
    the model loads): a MixtureError names what is wrong and the fix."""
    from autocurricula.publish.mixture import read_mixture  # mlx (the adapter checks)

    out = _adapter_args(items, "--mixture", "a folder trainer.export_mixture wrote")
    for name, folder in out.items():
        if name in adapters:
            raise UsageError(f"--mixture {name} and --adapter {name}: one name for two models; rename one")
        read_mixture(folder)
    return out


def _check_loadable(model, *, fetch: bool) -> None:
    """Before a model is loaded for training or serving: it is a folder or a Hub id (``fetch``: one
    that is downloaded, or found in the cache, now), and a folder passes the checks that need no
    weights loaded (config.json, a family the engine serves, weights). A ModelNotFoundError,
    ModelLoadError or UnsupportedModelError naming the cause and the fix otherwise."""
    from autocurricula.publish.check_model import inspect_model_folder, resolve  # mlx, transformers
    from autocurricula.publish.hub import check_model_source  # huggingface_hub

    if fetch or Path(str(model)).expanduser().exists():
        inspect_model_folder(resolve(model))
    else:
        check_model_source(model)  # train() fetches a Hub id itself, and names the failure


def _serve(args) -> None:
    from autocurricula.serve.server import serve  # fastapi, uvicorn, mlx

    adapters = _adapter_args(args.adapter)
    mixtures = _mixture_args(args.mixture, adapters)
    _check_loadable(args.model, fetch=True)
    serve(args.model, host=args.host, port=args.port, api_key=args.api_key, max_slots=args.max_slots,
          adapter_root=args.adapter_root, served_model_name=args.served_model_name, max_batch=args.max_batch,
          max_request_bytes=args.max_request_bytes, max_upload_bytes=args.max_upload_bytes,
          max_lora_rank=args.max_lora_rank or None, timeout_keep_alive=args.timeout_keep_alive,
          keep_quantized=args.keep_quantized, adapters=adapters, mixtures=mixtures,
          max_mixture_sessions=args.max_mixture_sessions, mixture_seed=args.mixture_seed,
          prefix_cache_mb=args.prefix_cache_mb, threads=args.threads, header_timeout_s=args.header_timeout,
          max_connections=args.max_connections, body_timeout_s=args.body_timeout,
          max_cpu_adapters=args.max_cpu_adapters or None, max_cpu_adapter_bytes=args.max_cpu_adapter_bytes,
          max_concurrent_uploads=args.max_concurrent_uploads,
          max_batch_tokens=args.max_batch_tokens, max_queue_s=args.max_queue_s or None,
          max_chat_messages=args.max_chat_messages)


LEAGUES = {"selfplay": ("SelfPlayTrainer", "SelfPlayConfig"), "league": ("LeagueTrainer", "LeagueConfig"),
           "fictitious": ("FictitiousPlayTrainer", "FictitiousConfig"),
           "roundrobin": ("RoundRobinTrainer", "RoundRobinConfig")}


def _train(args) -> None:
    import autocurricula.leagues as leagues  # the trainers import mlx: only when training

    settings = {}
    if args.config:
        with open(args.config) as fh:
            try:
                settings = yaml.safe_load(fh) or {}
            except yaml.YAMLError as exc:
                raise UsageError(f"--config {args.config} is not valid YAML: {exc}") from exc
        if not isinstance(settings, dict):
            raise SystemExit(f"{args.config}: expected a mapping of settings")
    grpo = settings.pop("grpo", None)
    lora = settings.pop("lora", None)
    for key in ("epochs", "rounds", "output_dir", "seed", "max_staleness", "threads"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    if args.overwrite_output_dir:
        settings["overwrite_output_dir"] = True
    module, _, fn = args.game.partition(":")
    name = module if ("." in module or fn) else f"autocurricula.games.{module}"
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # --game mygame:play finds ./mygame.py, as `python -m` would
    try:
        play = getattr(importlib.import_module(name), fn or "play")
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"--game {args.game}: {exc}. Use a module of autocurricula.games (e.g. tictactoe) or "
                         "an importable 'module.path:function'") from None
    recipe = None
    if args.league == "auto":  # the configuration the game's facts choose (docs/leagues.md)
        from autocurricula.leagues.default import choose

        try:
            recipe = choose(play)
        except ValueError as exc:
            raise UsageError(f"--league auto: {exc}; or name a league with --league") from exc
        if grpo and "learning_rate" in grpo:
            raise UsageError("--league auto sets the rate as its share of the model's own: drop 'learning_rate' "
                             "from the 'grpo:' section, or name a league with --league")
        config_cls = recipe.trainer.config_class
        config_name = config_cls.__name__
    else:
        trainer_name, config_name = LEAGUES[args.league]
        config_cls = getattr(leagues, config_name)
    known = {f.name for f in dataclasses.fields(config_cls)}
    unknown = set(settings) - known
    if unknown:
        league_own = sorted(unknown & {f.name for f in dataclasses.fields(config_cls.rules_class)})
        where = f"; {league_own} are {config_cls.rules_class.__name__} settings: put them under 'rules:'" \
            if league_own else ""
        raise SystemExit(f"unknown {config_name} settings {sorted(unknown)}; known: {sorted(known)} "
                         f"(plus 'grpo:' and 'lora:' sections){where}")
    from autocurricula.loop.config import coerce_grpo_config, coerce_lora_spec  # mlx

    try:
        config = config_cls(**settings)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{exc} (--config {args.config})" if args.config else str(exc)) from exc
    for section, value, coerce in (("grpo", grpo, coerce_grpo_config), ("lora", lora, coerce_lora_spec)):
        if value is not None:  # validated here, before any model loads; train() gets them as written
            try:
                coerce(value)
            except (ValueError, TypeError) as exc:
                raise UsageError(f"the '{section}:' section of --config {args.config}: {exc}") from exc
    _check_loadable(args.model, fetch=False)
    if recipe is None:
        trainer = getattr(leagues, trainer_name)(config)
    servers = args.server
    if args.ray_actors:  # rollout (and learner) actors on the Ray cluster RAY_ADDRESS names, or a local one
        if args.server:
            raise SystemExit("autocurricula train: give --server or --ray-actors, not both")
        from autocurricula.fleet.cluster import RayEngine  # ray

        servers = RayEngine(args.model, num_actors=args.ray_actors, learners=args.ray_learners,
                            address=os.environ.get("RAY_ADDRESS"))
    try:
        if recipe is None:
            trainer.train(args.model, play, lora_config=lora, grpo_config=grpo,
                          resume_from_checkpoint=args.resume or None, servers=servers, api_key=args.api_key)
        else:
            from autocurricula.leagues.default import train as train_default

            config = {k: v for k, v in settings.items() if k not in ("epochs", "rounds")}  # seed: train()'s
            trainer = train_default(args.model, play, recipe=recipe, epochs=settings.get("epochs"),
                                    rounds=settings.get("rounds"), grpo_config=grpo, lora_config=lora, servers=servers,
                                    api_key=args.api_key, resume_from_checkpoint=args.resume or None, **config)
    finally:
        if servers is not args.server:
            servers.close()
    print(trainer.leaderboard)


def _dashboard(args) -> None:
    from autocurricula.serve.dashboard import run_dashboard  # fastapi, uvicorn

    run_dashboard(args.output_dir, host=args.host, port=args.port)  # a missing folder: FileNotFoundError, named


def _check_model(args) -> None:
    from autocurricula.publish.check_model import check_model, format_table, passed  # mlx, transformers

    if args.tiny_family:
        from autocurricula.engine.tiny import build_family_model  # transformers

        try:
            build_family_model(args.model, args.tiny_family)
        except ValueError as exc:  # an unknown family
            raise UsageError(f"--tiny-family {args.tiny_family}: {exc}") from exc
    results = check_model(args.model, max_tokens=args.max_tokens)  # a model that does not load: a row
    print(format_table(args.model, results), flush=True)
    if args.debug:
        for r in results:
            if r.error is not None:
                print(f"--- {r.name}:", "".join(traceback.format_exception(r.error)), sep="\n", file=sys.stderr)
    if not passed(results):
        raise SystemExit(1)


BENCH_WORKLOADS = {"peers": ("single", "multiturn", "tictactoe", "negotiation"),
                   "train": ("tictactoe", "kuhn", "negotiation", "dataset")}


def _bench(args) -> None:
    workload = getattr(args, "workload", None)
    if workload is not None and workload not in BENCH_WORKLOADS.get(args.what, ()):
        takes = "; ".join(f"bench {k}: {', '.join(v)}" for k, v in BENCH_WORKLOADS.items())
        raise UsageError(f"--workload {workload} is not a workload of bench {args.what} ({takes})")
    if args.what == "engine":
        from autocurricula.bench.engine import main  # mlx
    elif args.what == "peers":
        from autocurricula.bench.peers import main  # mlx, torch
    elif args.what == "league":
        from autocurricula.bench.league import main  # mlx
    elif args.what == "round":
        from autocurricula.bench.round import main  # mlx, torch
    elif args.what == "learn":
        from autocurricula.bench.learn import main  # mlx, open_spiel
    else:
        from autocurricula.bench.train import main  # mlx
    main(args)


def _check_bench(parser: argparse.ArgumentParser, args) -> None:
    """What argparse cannot see flag by flag: the engine bench's model against this machine's memory
    (``parser.error``: exit status 2, the flags named, no traceback)."""
    problem = bench_args.memory_problem(args) or bench_args.games_problem(args)
    if problem:
        parser.error(problem)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autocurricula", description=DESCRIPTION)
    p.add_argument("--debug", action="store_true",
                   help="show the traceback of an error instead of the one-line message that names the fix")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="OpenAI-compatible multi-LoRA server")
    s.add_argument("--model", required=True, help="Hugging Face id or local folder (mlx-lm format or HF safetensors)")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    s.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every route but /health")
    s.add_argument("--max-slots", type=int, default=64, help="adapters resident at once (LRU beyond)")
    s.add_argument("--adapter-root", default=None, help="folder that /v1/load_lora_adapter paths must lie under")
    s.add_argument("--adapter", action="append", default=None, metavar="NAME=FOLDER",
                   help="load a player's adapter (peft or mlx-lm folder) before serving; repeatable")
    s.add_argument("--mixture", action="append", default=None, metavar="NAME=FOLDER",
                   help="serve a league's mixture (the folder trainer.export_mixture wrote) as model NAME: each new "
                        "conversation draws one adapter by the weights in mixture.json and keeps it (session key: "
                        "the X-Session-Id header, else the request's user field); repeatable (default: none; "
                        "docs/deploy.md)")
    s.add_argument("--max-mixture-sessions", type=int, default=100_000,
                   help="conversations whose drawn adapter the server remembers; beyond it the least recently used "
                        "is forgotten and draws again on its next turn (default 100000)")
    s.add_argument("--mixture-seed", type=int, default=None,
                   help="seed of the mixtures' draws, for reproducible evaluations (default: a fresh one each start)")
    s.add_argument("--served-model-name", default=None, help="the base model's name in the API (default: --model)")
    s.add_argument("--max-batch", type=int, default=64, help="rows decoded together in one step")
    s.add_argument("--threads", type=int, default=None,
                   help="CPU backend on Linux: threads of the BLAS matmuls (default: every core). A server that "
                        "shares the machine with `autocurricula train` should leave it cores: e.g. half of them")
    s.add_argument("--prefix-cache-mb", type=float, default=64.0,
                   help="memory of the prefix cache: KV rows reused per adapter version when a prompt starts the "
                        "same way as an earlier one (chat histories); 0 = off")
    s.add_argument("--max-request-bytes", type=int, default=8 << 20,
                   help="largest JSON request body in bytes; bigger ones get 413 before parsing (default 8 MiB)")
    s.add_argument("--max-upload-bytes", type=int, default=2 << 30,
                   help="largest adapter upload (PUT /v1/adapters/NAME) in bytes (default 2 GiB)")
    s.add_argument("--max-lora-rank", type=int, default=64,
                   help="largest adapter rank accepted (as in vLLM); the shared stacks grow to the widest "
                        "adapter, so every player pays for it (0 = no limit; default 64)")
    s.add_argument("--timeout-keep-alive", type=float, default=75.0,
                   help="seconds an idle HTTP connection stays open (default 75, as nginx); keep it above your "
                        "clients' idle timeout (httpx 5 s, aiohttp 15 s) so they never reuse a closing connection")
    s.add_argument("--header-timeout", type=float, default=30.0,
                   help="seconds a connection may take to send a request's headers (slow or idle sockets are "
                        "closed; default 30)")
    s.add_argument("--body-timeout", type=float, default=60.0,
                   help="seconds a JSON body may take to arrive after its headers (408 after); an adapter upload "
                        "may pause at most 10 s (or this, if shorter) and must average 1 MiB/s after that "
                        "(default 60)")
    s.add_argument("--max-connections", type=int, default=512,
                   help="connections and requests at once; beyond it the server answers 503 (default 512)")
    s.add_argument("--max-cpu-adapters", type=int, default=256,
                   help="adapters the server holds in memory at once, as vLLM's --max-cpu-loras; beyond it the least "
                        "recently used idle ones spill to --adapter-root/.spilled (without a root: 507 for a new "
                        "one; 0 = no limit; default 256)")
    s.add_argument("--max-cpu-adapter-bytes", type=int, default=None,
                   help="bytes of adapter weights the server holds in memory, spilled as --max-cpu-adapters is "
                        "(default: no limit but the count)")
    s.add_argument("--max-concurrent-uploads", type=int, default=2,
                   help="adapter uploads read and parsed at once; the others wait, then get 429 (default 2)")
    s.add_argument("--max-batch-tokens", type=int, default=None,
                   help="largest sum of max_tokens in one /v1/batch/completions (default: --max-batch times the "
                        "per-request limit)")
    s.add_argument("--max-queue-s", type=float, default=120.0,
                   help="a request still queued after this many seconds gets 503 with Retry-After, so one client's "
                        "backlog cannot hold another's request for ever (0 = no limit; default 120)")
    s.add_argument("--max-chat-messages", type=int, default=1024,
                   help="messages in one chat request (default 1024, at most 4096)")
    s.add_argument("--keep-quantized", action="store_true",
                   help="CPU backend: keep a quantized or bf16/fp16 base as stored instead of converting it to "
                        "float32 at load (MLX's CPU quantized/half matmuls are 3-18x slower; float32 takes 8x the "
                        "memory of 4-bit). Metal and CUDA always keep the stored weights")
    s.set_defaults(func=_serve)

    t = sub.add_parser("tiny-model", help="write the built-in tiny model (no download)")
    t.add_argument("path", help="folder to write the model into (config.json, safetensors, tokenizer)")
    t.add_argument("--model-type", default="llama", choices=["llama", "qwen2"],
                   help="the architecture (default: llama)")
    t.add_argument("--hidden", type=int, default=256, help="hidden size (default: 256)")
    t.add_argument("--layers", type=int, default=4, help="transformer blocks (default: 4)")
    t.add_argument("--vocab", type=int, default=1024, help="vocabulary size of its tokenizer (default: 1024)")
    t.add_argument("--quantize-bits", type=int, default=None, help="also convert with mlx-lm (e.g. 4)")
    t.add_argument("--overwrite", action="store_true", help="replace a model already in PATH")
    t.set_defaults(func=_tiny)

    tr = sub.add_parser("train", help="train a league on a game")
    tr.add_argument("--model", required=True, help="Hugging Face id or local folder")
    tr.add_argument("--game", default="tictactoe",
                    help="a module of autocurricula.games (tictactoe, kuhn_poker, negotiation, ...), or "
                         "module.path:function for your own (default: tictactoe)")
    tr.add_argument("--league", default="auto", choices=["auto", *sorted(LEAGUES)],
                    help="who plays whom: auto (the configuration the game's facts choose, printed with why: "
                         "league, credit, rate, budget and warm-up), AlphaStar's league, self-play, fictitious play "
                         "or a round robin (default: auto; docs/leagues.md)")
    tr.add_argument("--config", default=None,
                    help="YAML of the league config's fields; the league's own settings (LeagueRules, SelfPlayRules, "
                         "...: main_agents, games_per_round...) go in a 'rules:' mapping; optional 'grpo:' and "
                         "'lora:' sections")
    tr.add_argument("--epochs", type=int, default=None, help="epochs; entry() adds players at each (default: "
                                                              "the chosen configuration's, 12, under auto; else 4)")
    tr.add_argument("--rounds", type=int, default=None, help="rounds per epoch, one update each (default: "
                                                              "the chosen configuration's under auto; else 2)")
    tr.add_argument("--seed", type=int, default=None, help="seed of schedules, seats, sampling and adapter init "
                                                            "(default: 0 under auto; else the config's, 42)")
    tr.add_argument("--output-dir", dest="output_dir", default=None,
                    help="checkpoints, metrics, match history and plots (default: the config's, autocurricula-output)")
    tr.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in output_dir")
    tr.add_argument("--server", action="append", default=None, metavar="URL",
                    help="play the games on this running `autocurricula serve` (same base model), or on a vLLM "
                         "server named vllm+http://host:port (docs/cluster.md); repeatable. Updates run here and "
                         "each changed adapter is pushed to the servers")
    tr.add_argument("--api-key", default=None, help="the servers' --api-key")
    tr.add_argument("--ray-actors", dest="ray_actors", type=int, default=0, metavar="N",
                    help="play the games on N Ray rollout actors (pip install 'autocurricula[ray]'; joins the "
                         "cluster RAY_ADDRESS names, else starts a local one; docs/cluster.md)")
    tr.add_argument("--ray-learners", dest="ray_learners", type=int, default=0, metavar="N",
                    help="with --ray-actors: run the updates on N Ray learner actors, players shared out between them")
    tr.add_argument("--max-staleness", dest="max_staleness", type=int, default=None, metavar="K",
                    help="play round r+1 while round r updates (with --server), dropping turns more than K adapter "
                         "versions old; 0 = serial rounds (the default)")
    tr.add_argument("--threads", type=int, default=None,
                    help="BLAS threads of the trainer's matmuls (default: every core); with `autocurricula serve` on "
                         "the same machine, split the cores (e.g. serve --threads 1 and train --threads 1 on 2 cores)")
    tr.add_argument("--overwrite-output-dir", dest="overwrite_output_dir", action="store_true",
                    help="delete another run's checkpoints and logs in output_dir and start afresh")
    tr.set_defaults(func=_train)

    d = sub.add_parser("dashboard", help="a read-only page for a run's output folder (refreshes while it trains)")
    d.add_argument("output_dir", help="the run's output_dir (metrics.jsonl, match_history.jsonl, checkpoint-*)")
    d.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only; the page has no login)")
    d.add_argument("--port", type=int, default=8050, help="port of the page (default: 8050)")
    d.set_defaults(func=_dashboard)

    e = sub.add_parser("env", help="versions, device, active BLAS and matmul speed")
    e.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    e.set_defaults(func=_env)

    c = sub.add_parser("check-model", help="run the engine's conformance checks on a model folder or Hub id "
                                           "and print a table (docs/models.md)")
    c.add_argument("model", help="model folder or Hub id")
    c.add_argument("--tiny-family", default=None, metavar="FAMILY",
                   help="first build a tiny random model of FAMILY (opt, gpt2, llama, qwen3, gemma3...) at MODEL")
    c.add_argument("--max-tokens", type=int, default=12, help="greedy tokens compared per check")
    c.set_defaults(func=_check_model)

    b = sub.add_parser("bench", help="benchmarks (ratios measured side by side)")
    b.add_argument("what", choices=["engine", "train", "peers", "league", "round", "learn"],
                   help="engine: multi-LoRA batch vs base batch; train: fused update vs single updates (and "
                        "--workload token counts); peers: against vLLM, transformers+peft and mlx-lm; league: "
                        "overlapping rounds vs serial; round: a whole round vs the assembled peers "
                        "(docs/benchmarks.md); learn: the default configuration (autocurricula.train) on 20 random "
                        "matrix games and four OpenSpiel games, scored by exact exploitability as played, beside "
                        "plain self-play (docs/leagues.md)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.add_argument("--model", default=None, help="model id/folder instead of the tiny bench model")
    b.add_argument("--hidden", type=bench_args.count("--hidden"), default=256,
                   help="engine: hidden size of the tiny bench model (a multiple of 8)")
    b.add_argument("--layers", type=bench_args.count("--layers"), default=4, help="engine: its layers")
    b.add_argument("--batch", type=bench_args.count("--batch"), default=64, help="engine: rows decoded together")
    b.add_argument("--new-tokens", type=bench_args.count("--new-tokens"), default=48,
                   help="engine: tokens generated per row")
    b.add_argument("--quick", action="store_true", help="fewer repeats (CI smoke run)")
    b.add_argument("--repeats", type=bench_args.count("--repeats"), default=None,
                   help="league: runs of every setting, interleaved (default 3, 1 with --quick); round: rounds per "
                        "side (default 3 at the bench shape, 2 at qwen0.5b); figures are medians with their spread")
    b.add_argument("--games", type=bench_args.games, default=None,
                   help="round: games per round (default 64, the example's); learn: the suite's games to run, "
                        "comma-separated: matrix (the 20 matrix games), matrix:N (the first N), kuhn, leduc, goofspiel, "
                        "liars_dice, or any two-player OpenSpiel game string; kuhn_builtin: the package's own Kuhn "
                        "poker with its warm-up examples (default: matrix,kuhn,leduc,goofspiel,liars_dice)")
    b.add_argument("--seeds", type=bench_args.count("--seeds"), nargs="+", default=[0],
                   help="learn: the seeds to run, each with its own tiny base model (default: 0)")
    b.add_argument("--budget", choices=["smoke", "short", "full"], default="short",
                   help="learn: smoke (1 round of 4 games, a 32-wide 1-layer model, 10 warm-up steps: a check of "
                        "the machinery, under 2 minutes for two games), short (2 epochs x 4 rounds of 32 games, "
                        "100 warm-up steps; the default) or full (the default configuration's own: 12 x 8 rounds of "
                        "128 games, 200 warm-up steps)")
    b.add_argument("--epochs", type=bench_args.count("--epochs"), default=None,
                   help="learn: epochs (default: the budget's)")
    b.add_argument("--rounds", type=bench_args.count("--rounds"), default=None,
                   help="learn: rounds per epoch (default: the budget's)")
    b.add_argument("--games-per-round", dest="games_per_round", type=bench_args.count("--games-per-round"),
                   default=None, help="learn: games a round, for the default and for plain self-play alike (default: "
                                      "the budget's)")
    b.add_argument("--warmup-steps", dest="warmup_steps", type=bench_args.count("--warmup-steps", low=0),
                   default=None, help="learn: steps of the format warm-up on each game (0 = none; default: the "
                                      "budget's)")
    b.add_argument("--matrix-games", dest="matrix_games", type=bench_args.count("--matrix-games"), default=20,
                   help="learn: how many random matrix games 'matrix' runs (default 20)")
    b.add_argument("--payoff-scale", dest="payoff_scale", type=float, default=1.0,
                   help="learn: multiply every game's payoffs by this (e.g. 100: the same suite in other units; "
                        "figures in the scaled units, shares of the range unchanged; default 1)")
    b.add_argument("--no-selfplay", dest="no_selfplay", action="store_true",
                   help="learn: skip plain self-play beside the default (half the time)")
    b.add_argument("--output", default=None, help="learn: append each game's JSON row to this file")
    b.add_argument("--torch-threads", type=bench_args.count("--torch-threads"), default=None,
                   help="round, and peers --workload tictactoe|negotiation: threads of the torch + peft update "
                        "(default: every core; 1 is fair on a shared machine)")
    b.add_argument("--rollouts", default="engine", choices=["engine", "vllm"],
                   help="round: vllm also plays the round's games on a vLLM server (started with --vllm-python) "
                        "with our update, beside the engine and the assembled peers (default: engine)")
    b.add_argument("--shape", default="bench", choices=["bench", "qwen0.5b"],
                   help="peers, round: the bench model (llama, hidden 256, 4 layers) or a random Qwen2.5-0.5B-shaped one")
    b.add_argument("--torch-device", default="auto", choices=["auto", "cpu", "cuda", "mps"],
                   help="peers: where the torch + peft sides run (auto: cpu when MLX runs on its CPU backend, "
                        "else the GPU torch sees)")
    b.add_argument("--vllm-python", default=None, help="peers, round: python of a virtual environment with vLLM "
                   "(else $AUTOCURRICULA_VLLM_PYTHON); the vLLM side is skipped without one")
    b.add_argument("--mlx-lm-lora-python", default=None, help="peers: python of a virtual environment with "
                   "mlx-lm-lora (else $AUTOCURRICULA_MLX_LM_LORA_PYTHON); its side is skipped without one")
    b.add_argument("--peers-only", action="store_true", help="peers: only the vLLM and mlx-lm-lora sides")
    b.add_argument("--workload", default=None,
                   choices=["single", "multiturn", "tictactoe", "kuhn", "negotiation", "dataset"],
                   help="peers: single (64 independent turns a round, the default), multiturn (conversations "
                        "whose prompts grow turn by turn: engine, peft mixed and vLLM, with prefix-cache hit "
                        "rates), or tictactoe / negotiation (one round of those games: our update against torch + "
                        "peft only); train: tictactoe, kuhn, negotiation (chat) or dataset (GRPO, G = 8): one "
                        "round's tokens per row against each learner's prefix trie, and its update tree-packed "
                        "and per row side by side (--games a round, --repeats rounds)")
    b.set_defaults(func=_bench, check_args=lambda args: _check_bench(b, args))
    for command in sub.choices.values():  # `autocurricula COMMAND ... --debug` works too
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the traceback of an error instead of the message that names the fix")
    return p


def main(argv=None) -> None:
    """Run a command. A problem the user can fix (:func:`user_error`) ends as
    ``SystemExit("autocurricula COMMAND: message")`` (status 1, no traceback) unless ``--debug``."""
    args = build_parser().parse_args(argv)
    if getattr(args, "check_args", None) is not None:  # checks across flags, still as argparse errors
        args.check_args(args)
    try:
        args.func(args)
    except Exception as exc:  # noqa: BLE001 - sorted into the user's problems and bugs
        message = None if args.debug else user_error(exc, getattr(args, "model", None))
        if message is None:
            raise
        raise SystemExit(f"autocurricula {args.command}: {message}") from None


if __name__ == "__main__":
    sys.exit(main())
