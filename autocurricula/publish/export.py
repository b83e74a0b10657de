"""Players out of and into MLX: peft checkpoints and mlx-lm adapter folders.

Mapping (mlx-lm orientation on our side): peft ``lora_A.weight = lora_a.T`` ``(r, in)``,
``lora_B.weight = lora_b.T`` ``(out, r)``, keys ``base_model.model.<MLX module path>.lora_X.weight``,
``lora_alpha = scale * r`` (mlx-lm's scale is a plain multiplier) or ``scale * sqrt(r)`` with rsLoRA.
Where mlx-lm names a family's blocks differently from transformers (GPT-2: ``model.h.N`` for
``transformer.h.N``; GPT-NeoX: ``model.h.N`` for ``gpt_neox.layers.N``), the peft keys carry
transformers' names, and ``import_peft`` and the engine's ``load_folder`` map them back
(:mod:`autocurricula.engine.module_names`).
The peft checkpoint loads with ``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), dir)``
and gives the same logits as the engine (tested to 1e-4 in float32).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from autocurricula.engine import module_names
from autocurricula.records import is_scripted
from autocurricula.engine.adapters import (PEFT_PREFIX, AdapterError, AdapterWeights, load_folder, renamed,
                                           write_mlx_folder)

# a module inside transformer block N: "layers.N" in most families, "h.N" in GPT-2 / GPT-NeoX (mlx-lm)
_LAYER = re.compile(r"^(?:.*\.)?(?:layers|h)\.(\d+)\.(.+)$")

def _atomic_folder(dest: Path):
    dest.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))


def _replace(tmp: Path, dest: Path) -> None:
    # swap in the finished folder; an old export is removed only after the new one is complete
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dest, old)
        os.replace(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dest)


def _targets(paths: list[str]) -> list[str]:
    """peft ``target_modules``: short names when every block has the same set, else full paths
    (peft matches a target by exact name or ``.name`` suffix, so full paths are exact)."""
    per_layer: dict[int, set[str]] = {}
    other = []
    for p in paths:
        m = _LAYER.match(p)
        if m:
            per_layer.setdefault(int(m.group(1)), set()).add(m.group(2))
        else:
            other.append(p)
    sets = list(per_layer.values())
    if not other and sets and all(s == sets[0] for s in sets):
        names = {s.rsplit(".", 1)[-1] for s in sets[0]}
        if len(names) == len(sets[0]):
            return sorted(names)
    return sorted(paths)


def peft_config(weights: AdapterWeights, base_model_name_or_path: str, use_rslora: bool = False,
                num_model_layers: int | None = None, fan_in_fan_out: bool = False) -> dict:
    """The ``adapter_config.json`` content for ``weights``. ``fan_in_fan_out``: the adapted layers
    store their weight as (in, out), as GPT-2's ``Conv1D`` does (peft warns and sets it otherwise)."""
    ranks = {a.shape[1] for a, _ in weights.modules.values()}
    if len(ranks) != 1:
        raise AdapterError(f"modules have different ranks {sorted(ranks)}; peft export needs one rank")
    r = ranks.pop()
    alpha = weights.scale * (math.sqrt(r) if use_rslora else r)
    targets = _targets(list(weights.modules))
    if num_model_layers is not None and targets != sorted(weights.modules):
        covered = {int(_LAYER.match(p).group(1)) for p in weights.modules}
        if covered != set(range(num_model_layers)):  # short names would adapt blocks we have no weights for
            targets = sorted(weights.modules)
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base_model_name_or_path),
           "r": r, "lora_alpha": alpha, "lora_dropout": 0.0, "target_modules": targets, "bias": "none",
           "fan_in_fan_out": fan_in_fan_out, "use_rslora": use_rslora, "use_dora": False, "modules_to_save": None,
           "init_lora_weights": True, "inference_mode": True, "rank_pattern": {}, "alpha_pattern": {}}
    try:  # let peft fill in the fields of the installed version, so it loads without warnings
        from peft import LoraConfig  # peft: optional (extra hf), and it imports torch

        full = LoraConfig(**{k: v for k, v in cfg.items() if k != "peft_type"}).to_dict()
        full["target_modules"] = targets
        full["peft_type"] = "LORA"
        full["task_type"] = "CAUSAL_LM"
        cfg = {k: (sorted(v) if isinstance(v, set) else v) for k, v in full.items()}
    except ImportError:
        pass
    return cfg


def export_peft(weights: AdapterWeights, folder: str | Path, base_model_name_or_path: str, *,
                use_rslora: bool = False, num_model_layers: int | None = None, readme: str | None = None,
                model_type: str | None = None) -> Path:
    """Write a peft LoRA checkpoint (``adapter_config.json`` + ``adapter_model.safetensors``), atomically.

    ``base_model_name_or_path`` is the id or path the user gave for the base model.
    ``num_model_layers`` lets short target names be used only when every block is adapted; it is
    read from the base model's ``config.json`` when that is a local folder. ``model_type`` (e.g.
    ``"gpt2"``) picks transformers' module names; it is read from the base model's ``config.json``
    (a local folder or the Hugging Face cache) when not given. Modules peft would not place where
    the engine has them (:func:`autocurricula.engine.module_names.peft_conflicts`: an MoE router
    transformers does not build as a Linear, a name peft reads as fused routed experts) raise
    ``AdapterError`` naming them.
    """
    folder = Path(folder)
    if num_model_layers is None and (Path(base_model_name_or_path) / "config.json").is_file():
        num_model_layers = model_num_layers(base_model_name_or_path)
    model_type = model_type or module_names.base_model_type(base_model_name_or_path)
    conflicts = module_names.peft_conflicts(weights.modules, model_type)
    if conflicts:  # LoraSpec.resolve refuses these before training; an adapter from elsewhere may still hold them
        bad = sorted(conflicts)
        raise AdapterError(f"peft would not place the LoRA of {len(bad)} modules of this {model_type} adapter where "
                           f"the engine has it: {bad[:4]}{' ...' if len(bad) > 4 else ''} ({conflicts[bad[0]]}); "
                           "export it with format='mlx', or train without them (LoraSpec target_modules)")
    weights = renamed(weights, lambda p: module_names.hf_module_path(p, model_type))
    cfg = peft_config(weights, base_model_name_or_path, use_rslora, num_model_layers,
                      fan_in_fan_out=model_type in module_names.CONV1D_FAMILIES)
    tmp = _atomic_folder(folder)
    try:
        tensors = {}
        for path, (a, b) in weights.modules.items():
            tensors[f"{PEFT_PREFIX}{path}.lora_A.weight"] = np.ascontiguousarray(a.T, dtype=np.float32)
            tensors[f"{PEFT_PREFIX}{path}.lora_B.weight"] = np.ascontiguousarray(b.T, dtype=np.float32)
        save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
        (tmp / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
        if readme:
            (tmp / "README.md").write_text(readme)
        _replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def model_num_layers(base: str | Path | dict) -> int:
    """Transformer blocks of a base model: from an engine's ``linear_dims`` (module path -> dims)
    or from a model folder's ``config.json`` (``num_hidden_layers`` or GPT-2's ``n_layer``, also
    under ``text_config``)."""
    if isinstance(base, dict):
        layers = {int(m.group(1)) for p in base if (m := _LAYER.match(p))}
        if not layers:
            raise AdapterError("no transformer blocks ('layers.N' or 'h.N') among the model's modules")
        return max(layers) + 1
    config = Path(base) / "config.json"
    if not config.is_file():
        raise AdapterError(f"{base}: no config.json; pass num_model_layers= (the base model's block count)")
    cfg = json.loads(config.read_text())
    text = cfg.get("text_config") or {}
    n = cfg.get("num_hidden_layers") or cfg.get("n_layer") or text.get("num_hidden_layers")
    if not isinstance(n, int):
        raise AdapterError(f"{config} has no num_hidden_layers (or n_layer); pass num_model_layers=")
    return n


def export_mlx(weights: AdapterWeights, folder: str | Path, num_model_layers: int | None = None, *,
               base_model: str | Path | None = None) -> Path:
    """Write an mlx-lm adapter folder (``mlx_lm.load(model, adapter_path=folder)``,
    ``mlx_lm.generate --adapter-path folder``), atomically.

    mlx-lm adapts the last N blocks, so the folder needs the base model's block count: pass
    ``base_model`` (a local model folder), ``num_model_layers``, or neither when the adapter covers
    the model's last block (then the highest adapted block is taken as the last). N runs from the
    first adapted block to the last block, and modules outside the blocks are named by their full
    path (:func:`~autocurricula.engine.adapters.write_mlx_folder`), so any adapter the engine
    trains exports."""
    if num_model_layers is None:
        if base_model is not None:
            num_model_layers = model_num_layers(base_model)
        else:
            num_model_layers = model_num_layers({p: None for p in weights.modules})
    folder = Path(folder)
    tmp = _atomic_folder(folder)
    try:
        write_mlx_folder(weights, tmp, num_model_layers)
        _replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def import_peft(source: str | Path, *, revision: str | None = None, token: str | None = None,
                model_type: str | None = None) -> AdapterWeights:
    """A peft (or mlx-lm) adapter folder, or a Hub repo id (downloaded with ``snapshot_download``),
    as ``AdapterWeights`` with MLX module paths; unsupported variants (DoRA, embeddings,
    ``modules_to_save``...) raise ``AdapterError`` naming them.

    ``model_type`` (e.g. ``"gpt2"``) maps transformers' module names back to mlx-lm's; it is read
    from the config of the adapter's ``base_model_name_or_path`` (a local folder or the Hugging
    Face cache) when not given."""
    path = Path(source)
    if not path.exists():
        if str(source).count("/") != 1 or str(source).startswith((".", "/")):
            raise AdapterError(f"{source} is neither an adapter folder nor a Hub repo id ('owner/name')")
        from huggingface_hub import snapshot_download  # huggingface_hub (extra hub): only for a Hub id

        path = Path(snapshot_download(str(source), revision=revision, token=token,
                                      allow_patterns=["adapter_config.json", "*.safetensors"]))
    return load_folder(path, model_type=model_type)


def export_player(run, player_id: str, folder, format: str = "peft") -> Path:
    """A player of ``run`` (a :class:`~autocurricula.loop.run.Run`) as a ``"peft"`` or ``"mlx"``
    adapter folder (``trainer.export``)."""
    if format not in ("peft", "mlx"):
        raise ValueError(f"format must be 'peft' or 'mlx', got {format!r}")
    player = next((p for p in run.pool.players if p.id == player_id), None)
    if player is None:
        raise KeyError(f"no player {player_id!r} in the pool")
    if is_scripted(player):
        raise ValueError(f"{player_id} is a scripted player: it has no adapter to export")
    weights = run.engine.adapter_weights(player_id)
    layers = model_num_layers(run.engine.linear_dims)
    if format == "peft":
        return export_peft(weights, folder, run.model_name, use_rslora=run.lora.use_rslora,
                           num_model_layers=layers)
    return export_mlx(weights, folder, layers)
