"""Base-model fingerprints: a cheap hash of a model's config and weights.

A trainer and a server must run the same base model, or the adapters trained on one are wrong on
the other. Names can lie (two folders called ``base``), so both sides hash what they load:
``config.json`` as canonical JSON, and for every tensor of the ``*.safetensors`` files its name,
dtype, shape and a strided sample of its stored bytes (whole tensors when small). Reading the
sample costs a few KiB per tensor, so fingerprinting a 70B model reads megabytes, not gigabytes.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["BaseModelMismatchError", "compare", "fingerprint_engine", "fingerprint_folder", "fingerprint_model",
           "model_folder"]

_WINDOWS = 16  # sampled byte windows per tensor
_WINDOW = 256  # bytes per window
_WHOLE = _WINDOWS * _WINDOW * 4  # tensors up to this size are hashed whole


class BaseModelMismatchError(ValueError):
    """A server's base model is not the trainer's: adapters would not transfer between them."""


def model_folder(model: str | Path) -> Path | None:
    """The local folder of a model folder or an already downloaded Hub id (None if neither)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download  # huggingface_hub: optional (extra hub)

        return Path(snapshot_download(str(model), local_files_only=True, allow_patterns=["*.json", "*.safetensors"]))
    except Exception:  # noqa: BLE001 - not a Hub id, or not downloaded: no folder to hash
        return None


def _canonical_config(folder: Path) -> str:
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json; give the model folder mlx-lm loads")
    cfg = json.loads(cfg_path.read_text())
    return json.dumps(cfg, sort_keys=True, separators=(",", ":"))


def _sample_offsets(size: int) -> list[tuple[int, int]]:
    if size <= _WHOLE:
        return [(0, size)]
    step = (size - _WINDOW) // (_WINDOWS - 1)
    return [(i * step, _WINDOW) for i in range(_WINDOWS)]


def fingerprint_folder(model: str | Path) -> dict:
    """Fingerprint of a model folder (or downloaded Hub id) from its files, without loading it.

    Returns ``{"kind": "files", "config": sha256, "weights": sha256, "tensors": n}``.
    """
    folder = model_folder(model)
    if folder is None:
        raise FileNotFoundError(f"{model!r} is neither a model folder nor a downloaded Hub model; pass the folder")
    config = hashlib.sha256(_canonical_config(folder).encode()).hexdigest()
    h, count = hashlib.sha256(), 0
    entries = []
    for file in sorted(folder.glob("*.safetensors")):
        with open(file, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            entries += [(name, info, file, 8 + n) for name, info in header.items() if name != "__metadata__"]
    if not entries:
        raise FileNotFoundError(f"{folder} has no *.safetensors weights to fingerprint")
    handles: dict[Path, Any] = {}
    try:
        for name, info, file, base in sorted(entries, key=lambda e: e[0]):
            f = handles.get(file) or handles.setdefault(file, open(file, "rb"))
            start, end = info["data_offsets"]
            h.update(json.dumps([name, info["dtype"], info["shape"]]).encode())
            for off, length in _sample_offsets(end - start):
                f.seek(base + start + off)
                h.update(f.read(length))
            count += 1
    finally:
        for f in handles.values():
            f.close()
    return {"kind": "files", "config": config, "weights": h.hexdigest(), "tensors": count}


def fingerprint_model(model: Any, config: dict | None = None) -> dict:
    """Fingerprint of a loaded mlx-lm model from its parameters (for models given as objects,
    with no folder). Not comparable with :func:`fingerprint_folder`: the kinds differ."""
    import mlx.core as mx  # mlx: only for a model object; hashing a folder needs none
    from mlx.utils import tree_flatten

    if config is None:
        args = getattr(model, "args", None)
        scalars = (int, float, str, bool, type(None))
        config = {k: v for k, v in vars(args).items() if isinstance(v, scalars)} if args else {}
    h, count = hashlib.sha256(), 0
    for name, value in sorted(_base_parameters(tree_flatten(model.parameters())), key=lambda kv: kv[0]):
        flat = value.reshape(-1)
        stride = max(1, flat.size // 4096)
        sample = flat[::stride][:4096]
        if sample.dtype == mx.bfloat16:
            sample = sample.astype(mx.float32)
        h.update(json.dumps([name, str(value.dtype), list(value.shape)]).encode())
        h.update(np.array(sample).tobytes())
        count += 1
    cfg = hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()
    return {"kind": "params", "config": cfg, "weights": h.hexdigest(), "tensors": count}


def _base_parameters(params: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    # An engine wraps each adapted linear as {base, lora_a, lora_b} (engine/lora.py): the adapter
    # stacks change with every player and are no part of the base; "x.base.weight" is "x.weight".
    wrapped = {n[: -len(".lora_a")] for n, _ in params if n.endswith(".lora_a")}
    out = []
    for name, value in params:
        if name.endswith((".lora_a", ".lora_b")):
            continue
        prefix, sep, rest = name.partition(".base.")
        while sep and prefix not in wrapped:  # the ".base." of a wrapper, not of some module named base
            head, sep, rest = rest.partition(".base.")
            prefix = f"{prefix}.base.{head}"
        out.append((f"{prefix}.{rest}" if sep else name, value))
    return out


def fingerprint_engine(engine: Any) -> dict:
    """Fingerprint of the base model an :class:`~autocurricula.engine.Engine` serves: from its
    folder when the engine was loaded from one (its ``name`` is the folder or Hub id), else from
    its parameters."""
    folder = model_folder(engine.name)
    if folder is not None and (folder / "config.json").is_file():
        return fingerprint_folder(folder)
    return engine.call(fingerprint_model, engine.model).result()


def compare(expected: dict, got: dict, where: str) -> None:
    """Raise :class:`BaseModelMismatchError` unless two fingerprints name the same base model."""
    if expected.get("kind") != got.get("kind"):
        raise BaseModelMismatchError(
            f"cannot compare the base model of {where} with the trainer's: one was fingerprinted from its "
            f"files ({expected.get('kind')!r} vs {got.get('kind')!r}); load both from a model folder or Hub id, "
            "or pass check_base=False if you are sure they are the same model")
    for part in ("config", "weights", "tokenizer"):  # a tokenizer's probe when both sides give one (vLLM)
        if part == "tokenizer" and None in (expected.get(part), got.get(part)):
            continue
        if expected.get(part) != got.get(part):
            raise BaseModelMismatchError(
                f"the base model of {where} is not the trainer's: their {part} differ "
                f"({got.get(part, '?')[:12]} on the server, {expected.get(part, '?')[:12]} here); start the "
                "server with the same --model as the trainer")
