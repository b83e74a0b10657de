"""LoRA adapter weights: parse peft / mlx-lm folders and safetensors bytes, validate, version.

An ``AdapterWeights`` is host-side and framework-neutral: for each adapted module path (MLX path,
e.g. ``model.layers.0.self_attn.q_proj``) an ``a: (in, r)`` and ``b: (r, out)`` pair in mlx-lm's
orientation plus one ``scale`` (mlx-lm's plain multiplier; peft's ``lora_alpha / r``, or
``lora_alpha / sqrt(r)`` with rsLoRA).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import save, save_file

from autocurricula.engine.module_names import (base_model_type, default_lora_targets, has_hf_block_names,
                                              mlx_module_path, peft_conflicts)

PEFT_PREFIX = "base_model.model."
log = logging.getLogger(__name__)
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@+=-]{0,127}")  # used with fullmatch: no trailing newline


class AdapterError(ValueError):
    """An adapter that cannot be used; the message names the problem and the fix."""


class AdapterPathError(AdapterError):
    """An adapter file resolves (e.g. through a symlink) to a place outside the allowed root."""


F32_MAX = float(np.finfo(np.float32).max)


def finite32(x: float) -> bool:
    """Whether a number stays finite as float32 (the engine's dtype): 1e39 is finite only as float64."""
    try:
        x = float(x)
    except (TypeError, ValueError, OverflowError):
        return False
    return math.isfinite(x) and abs(x) <= F32_MAX


def _finite32_array(arr: np.ndarray, factor: float = 1.0) -> bool:
    if arr.size == 0:
        return True
    if not np.isfinite(arr).all():
        return False
    return float(np.abs(arr).max()) * abs(factor) <= F32_MAX


def check_name(name: str) -> str:
    """Player/adapter names become URL parts and folder names: no separators, no ``..``."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or ".." in name:
        raise AdapterError(
            f"invalid adapter name {name!r}: use 1-128 characters from letters, digits and _.:@+=- "
            "starting with a letter or digit, without '/' '\\' or '..'"
        )
    return name


@dataclass
class LoraSpec:
    """Rank and targets of an adapter, named as in ``peft.LoraConfig``.

    ``target_modules`` holds module-name suffixes (``"q_proj"``, ``"self_attn.v_proj"``),
    ``"all-linear"`` (every linear except the output head), or ``None``: the family's default, as
    peft keeps one per ``model_type`` (:data:`autocurricula.engine.module_names.LORA_TARGETS`:
    ``q_proj``/``v_proj`` for Llama-like models, ``c_attn`` for GPT-2, ``query_key_value`` for
    GPT-NeoX, ``qkv_proj`` for Phi-3, every linear for the hybrids LFM2 and Qwen3.5), resolved
    when the spec meets the model (:meth:`resolve` with the model's ``model_type``).
    """

    r: int = 8
    lora_alpha: float = 16.0
    target_modules: list[str] | str | None = None
    use_rslora: bool = False

    def __post_init__(self):
        if not isinstance(self.r, int) or self.r <= 0:
            raise ValueError(f"LoraSpec.r must be a positive int, got {self.r!r}")
        if isinstance(self.target_modules, str) and self.target_modules != "all-linear":
            self.target_modules = [self.target_modules]
        elif self.target_modules is not None and not isinstance(self.target_modules, str):
            self.target_modules = list(self.target_modules)

    @property
    def scale(self) -> float:
        return self.lora_alpha / (math.sqrt(self.r) if self.use_rslora else self.r)

    @classmethod
    def from_peft(cls, cfg) -> "LoraSpec":
        """From a ``peft.LoraConfig`` (or any object/dict with the same field names); no
        ``target_modules`` means the family's default, as in peft."""
        get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
        targets = get("target_modules") or None
        if targets is not None and not isinstance(targets, str):
            targets = sorted(targets)
        return cls(r=int(get("r", 8)), lora_alpha=float(get("lora_alpha", 8)),
                   target_modules=targets, use_rslora=bool(get("use_rslora", False)))

    def targets_for(self, model_type: str | None, linear_paths) -> list[str] | str:
        """``target_modules``, or for ``None`` the default of the ``model_type`` family."""
        if self.target_modules is not None:
            return self.target_modules
        return default_lora_targets(model_type, [p for p in linear_paths if not _is_head(p)])

    def resolve(self, linear_paths, model_type: str | None = None) -> list[str]:
        """The module paths of ``linear_paths`` (the model's adaptable linears) this spec targets.

        With the model's ``model_type`` (e.g. ``engine.model_type``), ``target_modules=None``
        takes the family's default, and targets are checked against what a peft export can name
        (:func:`autocurricula.engine.module_names.peft_conflicts`): a named target that peft
        would not place where the engine does (an MoE router transformers does not build as a
        Linear; a name peft reads as the fused routed experts) raises ``AdapterError`` naming
        the modules and the fix, before any training; ``"all-linear"`` leaves them out, and
        says so in the log."""
        paths = [p for p in linear_paths if not _is_head(p)]
        targets = self.targets_for(model_type, linear_paths)
        conflicts = peft_conflicts(paths, model_type)
        family = f" of {model_type}" if model_type else ""
        if targets == "all-linear":
            left_out = [p for p in paths if p in conflicts]
            if left_out:
                log.warning("all-linear leaves out %d linear layers%s that a peft export could not name: %s",
                            len(left_out), family, _why(conflicts, left_out))
            return [p for p in paths if p not in conflicts]
        out = [p for p in paths if any(p == t or p.endswith("." + t) for t in targets)]
        if not out:
            which = "the family's default target_modules" if self.target_modules is None else "target_modules"
            raise AdapterError(f"{which} {targets} match no linear layer of the model{family}; available names end "
                               f"with: {sorted({p.rsplit('.', 1)[-1] for p in paths})}. Pass target_modules=[...] "
                               f"with some of them (e.g. the attention projections), or 'all-linear'")
        if self.target_modules is None:
            log.info("LoRA targets %s: the default of %s", targets, model_type or "a model of unknown family")
        bad = [p for p in out if p in conflicts]
        if bad:
            keep = sorted({p.rsplit(".", 1)[-1] for p in out if p not in conflicts})
            fix = (f"target_modules={keep}" if keep else "other target_modules (e.g. the attention projections)")
            raise AdapterError(f"target_modules {targets} adapt {len(bad)} linear layers{family} that a peft export "
                               f"cannot name: {_why(conflicts, bad)}. Leave them out: {fix} "
                               f"('all-linear' leaves them out too)")
        return out


def _is_head(path: str) -> bool:
    return path.endswith(("lm_head", "embed_out"))  # output heads (GPT-NeoX: embed_out)


def _why(conflicts: dict[str, str], paths: list[str]) -> str:
    """``paths`` grouped by reason: 'a, b (reason); c (reason)', at most 4 paths a reason."""
    by_reason: dict[str, list[str]] = {}
    for p in paths:
        by_reason.setdefault(conflicts[p], []).append(p)
    return "; ".join(f"{', '.join(ps[:4])}{' ...' if len(ps) > 4 else ''} ({why})" for why, ps in by_reason.items())


@dataclass
class AdapterWeights:
    """One adapter's weights (host side): ``modules[path] = (a (in, r), b (r, out))`` and ``scale``."""

    modules: dict[str, tuple[np.ndarray, np.ndarray]]
    scale: float
    rank: int = 0

    def __post_init__(self):
        if not self.modules:
            raise AdapterError("adapter has no LoRA weights")
        bad = [p for p, (a, b) in self.modules.items() if getattr(a, "ndim", 0) != 2 or getattr(b, "ndim", 0) != 2]
        if bad:
            raise AdapterError(f"LoRA weights must be 2-D matrices; not so for {bad[:5]}")
        ranks = {a.shape[1] for a, _ in self.modules.values()}
        self.rank = max(ranks)
        if min(ranks) < 1:
            raise AdapterError("adapter has rank 0 (empty lora_A/lora_B); give every module rank >= 1")
        if not finite32(self.scale):
            raise AdapterError(f"adapter scale {self.scale!r} is not a finite float32 number (|scale| <= {F32_MAX:.4g}); "
                               "fix lora_alpha / r (peft) or lora_parameters.scale (mlx-lm), or pass ?scale=")

    @classmethod
    def random(cls, paths_dims: dict[str, tuple[int, int]], spec: LoraSpec, seed: int = 0,
               b_std: float = 0.02) -> "AdapterWeights":
        """Random adapter (non-zero ``b``, unlike peft's init) for tests and benchmarks."""
        rng = np.random.default_rng(seed)
        mods = {}
        for path, (din, dout) in paths_dims.items():
            a = rng.normal(0, 1 / math.sqrt(din), (din, spec.r)).astype(np.float32)
            b = rng.normal(0, b_std, (spec.r, dout)).astype(np.float32)
            mods[path] = (a, b)
        return cls(mods, spec.scale)

    def validate(self, dims: dict[str, tuple[int, int]]) -> None:
        """Check every module exists as a linear of the model with matching shapes."""
        errors = []
        for path, (a, b) in self.modules.items():
            if (problem := _misfit(path, tuple(a.shape), tuple(b.shape), dims)) is not None:
                errors.append(problem)
                if path not in dims:
                    continue
            if not _finite32_array(a) or not _finite32_array(b):
                errors.append(f"{path}: weights contain NaN or inf (or values beyond float32's range)")
            elif not _finite32_array(b, self.scale):
                errors.append(f"{path}: lora_b x scale {self.scale:g} overflows float32; lower the scale")
        if errors:
            raise AdapterError("adapter does not fit the base model:\n  " + "\n  ".join(errors[:20]))


def _misfit(path: str, a: tuple, b: tuple, dims: dict[str, tuple[int, int]]) -> str | None:
    """Why lora_a of shape ``a`` and lora_b of shape ``b`` cannot adapt ``path`` of a model whose
    linears are ``dims`` (None when they can)."""
    if path not in dims:
        return f"{path}: not a linear layer of the base model"
    din, dout = dims[path]
    if len(a) != 2 or len(b) != 2 or a[0] != din or b[1] != dout or a[1] != b[0]:
        return f"{path}: lora_a {a} / lora_b {b} do not fit a ({din}, r) / (r, {dout}) layer"
    return None


def _module_of(key: str, suffixes: tuple[str, ...]) -> tuple[str, str] | None:
    for s in suffixes:
        if key.endswith(s):
            return key[: -len(s)], s
    return None


def check_rank(rank: int, max_rank: int | None) -> None:
    """Refuse an adapter wider than ``max_rank`` (vLLM's ``--max-lora-rank``): the shared stacks
    grow to the widest adapter, so one huge rank would slow every player down."""
    if max_rank is not None and rank > max_rank:
        raise AdapterError(f"adapter rank {rank} exceeds the limit of {max_rank} (--max-lora-rank); "
                           f"train or export a rank <= {max_rank}, or raise the limit on the server")


LORA_SUFFIXES = (".lora_A.weight", ".lora_B.weight", ".lora_A.default.weight", ".lora_B.default.weight",
                 ".lora_a", ".lora_b")


def _lora_plan(entries, max_rank: int | None) -> dict[str, tuple[str, str, bool]]:
    """``{key: (module path, "a" or "b", stored transposed)}`` for ``entries`` of ``(key, dtype,
    shape as stored)``; refuses (``AdapterError``) a key that is no LoRA tensor, a dtype that is
    not floating point, a shape that is not 2-D, rank 0 or above ``max_rank``, and a module with
    only one of its pair. Needs no data: a safetensors header is enough."""
    plan, unknown = {}, []
    for key, dtype, shape in entries:
        hit = _module_of(key, LORA_SUFFIXES)
        if hit is None:
            unknown.append(key)
            continue
        path, kind = hit
        if path.startswith(PEFT_PREFIX):
            path = path[len(PEFT_PREFIX):]
        which = "a" if kind.lower().startswith(".lora_a") else "b"
        transposed = ".lora_A." in kind or ".lora_B." in kind  # peft stores (r, in) / (out, r)
        bf16 = isinstance(dtype, str) and dtype == "bf16"  # a header's bfloat16 (numpy has none)
        name = "bfloat16" if bf16 else np.dtype(dtype).name
        if not bf16 and np.dtype(dtype).kind != "f":
            raise AdapterError(f"tensor {key} has dtype {name}; LoRA weights must be float32, float16 or bfloat16")
        shape = tuple(shape)[::-1] if transposed else tuple(shape)
        if len(shape) != 2:
            raise AdapterError(f"tensor {key} has shape {shape}; LoRA weights must be 2-D matrices")
        rank = shape[1] if which == "a" else shape[0]
        if rank < 1:
            raise AdapterError(f"tensor {key} has rank 0 (shape {shape}); give every module rank >= 1")
        check_rank(rank, max_rank)
        plan[key] = (path, which, transposed)
    if unknown:
        hint = ("DoRA magnitude vectors are not supported; export a plain LoRA" if any("magnitude" in k for k in unknown)
                else "expected peft '...lora_A.weight'/'...lora_B.weight' or mlx-lm '...lora_a'/'...lora_b' keys")
        raise AdapterError(f"unsupported tensors in adapter: {unknown[:5]}{' ...' if len(unknown) > 5 else ''} ({hint})")
    have: dict[str, set] = {}
    for path, which, _ in plan.values():
        have.setdefault(path, set()).add(which)
    incomplete = [p for p, d in have.items() if d != {"a", "b"}]
    if incomplete:
        raise AdapterError(f"modules with only one of lora_A/lora_B: {incomplete[:5]}; every module needs both")
    return plan


def _held(arr: np.ndarray, transposed: bool) -> np.ndarray:
    """A tensor as an adapter holds it: mlx-lm's orientation, float32, contiguous; copied only
    when one of these changes it."""
    with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf: validate() reports it
        return np.ascontiguousarray(arr.T if transposed else arr, dtype=np.float32)


def _weights(pairs: dict[str, dict[str, np.ndarray]], peft_style: bool, scale, config: dict) -> AdapterWeights:
    """The adapter of ``pairs`` (``{path: {"a": ..., "b": ...}}``) with its scale: ``scale``, or
    from ``config`` (peft's ``lora_alpha / r``, or mlx-lm's ``lora_parameters.scale``)."""
    mods = {p: (d["a"], d["b"]) for p, d in pairs.items()}
    if scale is None:
        if peft_style or "lora_alpha" in config:
            r = next(iter(mods.values()))[0].shape[1] if mods else 1
            alpha = _number(config.get("lora_alpha", r), "lora_alpha")
            scale = alpha / (math.sqrt(r) if config.get("use_rslora") else r)
        else:
            params = config.get("lora_parameters", {})
            scale = _number(params.get("scale", 1.0) if isinstance(params, dict) else params, "lora_parameters.scale")
    return AdapterWeights(mods, _number(scale, "scale"))


def from_tensors(tensors: dict[str, np.ndarray], scale: float | None = None,
                 config: dict | None = None, max_rank: int | None = None) -> AdapterWeights:
    """Build weights from a flat tensor dict in peft or mlx-lm key format (auto-detected).

    peft: ``base_model.model.<path>.lora_A.weight (r, in)`` / ``lora_B.weight (out, r)``;
    mlx-lm: ``<path>.lora_a (in, r)`` / ``<path>.lora_b (r, out)``. ``scale`` overrides the
    config; otherwise peft's ``lora_alpha / r`` or mlx-lm's ``lora_parameters.scale`` is used.
    """
    plan = _lora_plan(((k, arr.dtype, arr.shape) for k, arr in tensors.items()), max_rank)
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, (path, which, transposed) in plan.items():
        pairs.setdefault(path, {})[which] = _held(tensors[key], transposed)
    return _weights(pairs, any(t for *_, t in plan.values()), scale, config or {})


def _number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str, np.number)):
        raise AdapterError(f"{name} must be a number, got {value!r}")
    try:
        out = float(value)
    except (ValueError, OverflowError):
        raise AdapterError(f"{name} must be a number, got {value!r}") from None
    if not finite32(out):
        raise AdapterError(f"{name}={value!r} is not a finite float32 number; set a finite value")
    return out


def _check_peft_config(cfg: dict, where: str) -> None:
    kind = str(cfg.get("peft_type", "LORA")).upper()
    problems = []
    if kind != "LORA":
        problems.append(f"peft_type {kind} (only LORA is supported)")
    if cfg.get("use_dora"):
        problems.append("use_dora=True (DoRA is not supported)")
    if cfg.get("modules_to_save"):
        problems.append(f"modules_to_save={cfg['modules_to_save']} (only LoRA deltas can be served)")
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        problems.append("rank_pattern/alpha_pattern (per-module ranks are not supported)")
    if cfg.get("bias", "none") != "none":
        problems.append(f"bias={cfg['bias']!r} (only bias='none' is supported)")
    if problems:
        raise AdapterError(f"unsupported peft adapter in {where}: " + "; ".join(problems))


def _inside(path: Path, root: str | None) -> Path:
    """``path`` with every symlink resolved, refused when that lands outside ``root``."""
    real = Path(os.path.realpath(path))
    if root is not None:
        top = os.path.realpath(root)
        if os.path.commonpath([top, str(real)]) != top:
            raise AdapterPathError(f"{path.name} in {path.parent} resolves to {real}, outside the adapter root; "
                                   "copy the files into the adapter folder instead of linking them")
    return real


def renamed(weights: AdapterWeights, rename) -> AdapterWeights:
    """``weights`` with each module path ``p`` as ``rename(p)``."""
    return AdapterWeights({rename(p): ab for p, ab in weights.modules.items()}, weights.scale)


def load_folder(path: str | Path, root: str | None = None, max_rank: int | None = None, *,
                model_type: str | None = None) -> AdapterWeights:
    """Load a peft (``adapter_model.safetensors``) or mlx-lm (``adapters.safetensors``) folder,
    with MLX module paths.

    ``root``: every file read must resolve (symlinks followed) inside this folder.
    ``max_rank``: refuse wider adapters before their tensors are copied.
    ``model_type``: the base model's family (e.g. ``"gpt2"``), which maps transformers' block
    names in a peft folder to mlx-lm's (:mod:`autocurricula.engine.module_names`); when not given
    it is read from the config of the adapter's ``base_model_name_or_path`` (a local folder or the
    Hugging Face cache)."""
    path = Path(path)
    cfg_file = path / "adapter_config.json"
    if not cfg_file.is_file():
        raise AdapterError(f"{path} has no adapter_config.json; expected a peft or mlx-lm adapter folder")
    try:
        config = json.loads(_inside(cfg_file, root).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise AdapterError(f"{cfg_file} is not valid JSON ({type(exc).__name__}); write a JSON object") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{cfg_file} holds a {type(config).__name__}; it must be a JSON object "
                           '(e.g. {"peft_type": "LORA", "r": 8, "lora_alpha": 16, ...})')
    if (path / "adapter_model.safetensors").is_file():
        _check_peft_config(config, str(path))
        tensors = read_safetensors(_inside(path / "adapter_model.safetensors", root).read_bytes())
    elif (path / "adapters.safetensors").is_file():
        if config.get("fine_tune_type", "lora") != "lora":
            raise AdapterError(f"{path}: fine_tune_type {config.get('fine_tune_type')!r} is not supported (only 'lora')")
        tensors = read_safetensors(_inside(path / "adapters.safetensors", root).read_bytes())
    elif (path / "adapter_model.bin").exists():
        raise AdapterError(f"{path} holds a pickle adapter_model.bin; re-save it with safetensors "
                           "(peft: save_pretrained(..., safe_serialization=True))")
    else:
        raise AdapterError(f"{path} has no adapter_model.safetensors (peft) or adapters.safetensors (mlx-lm)")
    weights = from_tensors(tensors, config=config, max_rank=max_rank)
    if not has_hf_block_names(weights.modules):
        return weights
    if model_type is None:
        model_type = _base_model_type(config, cfg_file)
    return renamed(weights, lambda p: mlx_module_path(p, model_type))


def _base_model_type(config: dict, cfg_file: Path) -> str | None:
    base = config.get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        return None
    try:
        return base_model_type(base)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{cfg_file}: the config.json of its base model {base!r} cannot be read "
                           f"({type(exc).__name__}); pass model_type= (e.g. 'gpt2')") from None


_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": "bf16", "F64": np.float64,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
# An adapter's header holds about 150 bytes per tensor: these bounds pass any real adapter (two
# tensors per adapted linear) and keep a hostile header from costing more than a few MiB to parse.
MAX_HEADER_BYTES = 4 << 20
MAX_TENSORS = 16384
_BAD = "body is not a valid safetensors file; send the bytes of a .safetensors file"


@dataclass
class SafetensorsHeader:
    """A parsed safetensors header: ``tensors[key] = (dtype, shape, start, end)`` with offsets
    into the data section, which is exactly ``data_bytes`` long (every byte covered once)."""

    tensors: dict[str, tuple]
    metadata: dict[str, str]
    header_bytes: int

    @property
    def data_bytes(self) -> int:
        return max((hi for *_, hi in self.tensors.values()), default=0)

    @property
    def total_bytes(self) -> int:
        """Size of the whole file: the 8-byte length, the header and the data."""
        return 8 + self.header_bytes + self.data_bytes


def header_length(prefix: bytes, max_header_bytes: int = MAX_HEADER_BYTES) -> int:
    """The header length stored in the first 8 bytes, refused when it is 0 or above ``max_header_bytes``."""
    if len(prefix) < 8:
        raise AdapterError(_BAD + " (too short)")
    n = int.from_bytes(prefix[:8], "little")
    if n <= 0:
        raise AdapterError(_BAD + " (bad header length)")
    if n > max_header_bytes:
        raise AdapterError(f"{_BAD} (its header of {n} bytes exceeds the limit of {max_header_bytes}; an adapter "
                           "needs about 150 bytes per tensor)")
    return n


def parse_header(raw: bytes, max_tensors: int = MAX_TENSORS) -> SafetensorsHeader:
    """Parse and check a header (the JSON after the 8-byte length): at most ``max_tensors``
    tensors, known dtypes, shapes that match their byte ranges, and ranges that tile the data
    section from 0 without gaps or overlaps (as the safetensors library requires)."""
    if (n := bytes(raw).count(b'"data_offsets"')) > max_tensors:  # before json builds an object per entry
        raise AdapterError(f"{_BAD} (it holds {n} tensors, more than the limit of {max_tensors})")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise AdapterError(_BAD + " (header is not JSON, or is nested too deeply)") from None
    if not isinstance(header, dict):
        raise AdapterError(_BAD + " (header is not an object)")
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise AdapterError(_BAD + " (__metadata__ must map names to strings)")
    if len(header) > max_tensors:
        raise AdapterError(f"{_BAD} (it holds {len(header)} tensors, more than the limit of {max_tensors})")
    tensors = {}
    for key, info in header.items():
        try:
            dtype = _DTYPES[info["dtype"]]
            shape, offsets = info["shape"], info["data_offsets"]
            if not (isinstance(shape, list) and len(shape) <= 8 and all(_is_size(s) for s in shape)
                    and isinstance(offsets, list) and len(offsets) == 2 and all(_is_size(o) for o in offsets)):
                raise ValueError
            lo, hi = offsets
        except (KeyError, TypeError, ValueError):
            raise AdapterError(f"{_BAD} (tensor {key!r}: unsupported dtype, or shape/data_offsets not lists of "
                               "non-negative integers)") from None
        width = 2 if dtype == "bf16" else np.dtype(dtype).itemsize
        if not lo <= hi or hi - lo != math.prod(shape) * width:  # math.prod is exact: no wrap-around
            raise AdapterError(f"{_BAD} (tensor {key!r}: offsets do not match its shape)")
        tensors[key] = (dtype, shape, lo, hi)
    end = 0
    for key, (*_, lo, hi) in sorted(tensors.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if lo != end:
            what = "overlaps another tensor" if lo < end else f"leaves bytes {end}..{lo} that no tensor covers"
            raise AdapterError(f"{_BAD} (tensor {key!r} {what}; write the file with the safetensors library)")
        end = hi
    return SafetensorsHeader(tensors, meta or {}, len(raw))


def tensors_from(header: SafetensorsHeader, data) -> dict[str, np.ndarray]:
    """The tensors of ``data`` (the data section, exactly ``header.data_bytes`` long) as numpy
    arrays that own their memory, so no view keeps the uploaded bytes alive (bfloat16 widened to float32)."""
    if len(data) != header.data_bytes:
        raise AdapterError(f"{_BAD} (its tensors cover {header.data_bytes} bytes after the header, but "
                           f"{len(data)} bytes follow it; send the file as written, without padding or truncation)")
    view = memoryview(data)
    out = {}
    for key, (dtype, shape, lo, hi) in header.tensors.items():
        out[key] = widened(np.frombuffer(view[lo:hi], dtype=stored_dtype(dtype)).reshape(shape), dtype, copy=True)
    return out


def stored_dtype(dtype) -> np.dtype:
    """The numpy dtype of a header's tensor as the file stores it (little-endian; bfloat16 as uint16)."""
    return np.dtype("<u2") if dtype == "bf16" else np.dtype(dtype).newbyteorder("<")


def widened(raw: np.ndarray, dtype, copy: bool = False) -> np.ndarray:
    """A tensor read as :func:`stored_dtype` in an array that owns its memory: bfloat16 (the top
    half of a float32) widened to float32, anything else as it is (copied when ``copy``)."""
    if dtype == "bf16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.copy() if copy else raw


def upload_plan(header: SafetensorsHeader, dims: dict[str, tuple[int, int]] | None = None,
                max_rank: int | None = None, scale: float | None = None) -> dict[str, tuple[str, str, bool]]:
    """Check an adapter's safetensors header before any of its data is read, for everything
    :func:`from_tensors` and :meth:`AdapterWeights.validate` would refuse from the shapes: keys,
    dtypes, 2-D shapes, ranks (``max_rank``), complete pairs and, with ``dims`` (the base model's
    ``{path: (in, out)}``), modules the model has with shapes that fit them; and the metadata's
    numbers the scale is taken from (unless ``scale`` is given). Returns ``{key: (module path,
    "a" or "b", stored transposed)}``, the plan :func:`held_tensor` follows."""
    _scale_of(header.metadata, scale)
    plan = _lora_plan(((k, dtype, shape) for k, (dtype, shape, *_) in header.tensors.items()), max_rank)
    if not plan:
        raise AdapterError("adapter has no LoRA weights")
    if dims is not None:
        shapes: dict[str, dict[str, tuple]] = {}
        for key, (path, which, transposed) in plan.items():
            shape = tuple(header.tensors[key][1])
            shapes.setdefault(path, {})[which] = shape[::-1] if transposed else shape
        errors = [e for path, ab in shapes.items() if (e := _misfit(path, ab["a"], ab["b"], dims)) is not None]
        if errors:
            raise AdapterError("adapter does not fit the base model:\n  " + "\n  ".join(errors[:20]))
    return plan


def held_bytes(header: SafetensorsHeader, plan: dict[str, tuple[str, str, bool]]) -> int:
    """Bytes the adapter of ``header`` will hold in memory (float32), from its header alone."""
    return 4 * sum(math.prod(header.tensors[key][1]) for key in plan)


def held_tensor(raw: np.ndarray, dtype, transposed: bool) -> np.ndarray:
    """A tensor read as :func:`stored_dtype` as the adapter holds it (see :func:`weights_from_plan`)."""
    return _held(widened(raw, dtype), transposed)


def weights_from_plan(header: SafetensorsHeader, plan: dict[str, tuple[str, str, bool]],
                      held: dict[str, np.ndarray], scale: float | None = None) -> AdapterWeights:
    """The adapter of an upload whose tensors ``held[key]`` were read by :func:`upload_plan`'s
    ``plan`` and made by :func:`held_tensor`; the scale as :func:`adapter_from_parts` takes it."""
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, (path, which, _) in plan.items():
        pairs.setdefault(path, {})[which] = held[key]
    return _weights(pairs, any(t for *_, t in plan.values()), *_scale_of(header.metadata, scale))


def _split(data, max_header_bytes: int, max_tensors: int) -> tuple[SafetensorsHeader, memoryview]:
    n = header_length(bytes(data[:8]), max_header_bytes)
    if 8 + n > len(data):
        raise AdapterError(_BAD + " (bad header length)")
    view = memoryview(data)
    return parse_header(bytes(view[8 : 8 + n]), max_tensors), view[8 + n :]


def read_safetensors(data, max_header_bytes: int = MAX_HEADER_BYTES, max_tensors: int = MAX_TENSORS) -> dict[str, np.ndarray]:
    """Parse safetensors bytes into numpy arrays that own their memory (bfloat16 widened to float32).

    Our own reader rather than ``mx.load`` so that parsing can run on any thread (MLX work must
    stay on the engine thread) and so that malformed input yields one clear error.
    """
    header, body = _split(data, max_header_bytes, max_tensors)
    return tensors_from(header, body)


def _is_size(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**48


def safetensors_metadata(data: bytes) -> dict:
    """The ``__metadata__`` strings of safetensors bytes (empty when absent or unreadable)."""
    try:
        return _split(data, MAX_HEADER_BYTES, MAX_TENSORS)[0].metadata
    except AdapterError:
        return {}


def adapter_from_parts(header: SafetensorsHeader, data, scale: float | None = None,
                       max_rank: int | None = None) -> AdapterWeights:
    """Build an adapter from a parsed header and its data section (peft or mlx-lm keys). Metadata
    may carry ``scale``, or ``lora_alpha`` (and ``use_rslora``), as strings; an explicit ``scale``
    argument wins."""
    scale, config = _scale_of(header.metadata, scale)
    return from_tensors(tensors_from(header, data), scale=scale, config=config, max_rank=max_rank)


def _scale_of(meta: dict[str, str], scale: float | None) -> tuple[float | None, dict]:
    """``(scale, config)`` from an upload's metadata strings; an explicit ``scale`` wins."""
    config = {}
    if "lora_alpha" in meta:
        config["lora_alpha"] = _number(meta["lora_alpha"], "metadata lora_alpha")
        config["use_rslora"] = str(meta.get("use_rslora", "false")).lower() == "true"
    if scale is None and "scale" in meta:
        scale = _number(meta["scale"], "metadata scale")
    return scale, config


def from_safetensors_bytes(data, scale: float | None = None, max_rank: int | None = None) -> AdapterWeights:
    """Parse uploaded safetensors bytes (peft or mlx-lm keys), header once; see :func:`adapter_from_parts`."""
    header, body = _split(data, MAX_HEADER_BYTES, MAX_TENSORS)
    return adapter_from_parts(header, body, scale, max_rank)


def to_safetensors_bytes(weights: AdapterWeights) -> bytes:
    """Serialise in mlx-lm key format with the scale in metadata (what the client uploads)."""
    tensors = {}
    for path, (a, b) in weights.modules.items():
        tensors[f"{path}.lora_a"] = np.ascontiguousarray(a, dtype=np.float32)
        tensors[f"{path}.lora_b"] = np.ascontiguousarray(b, dtype=np.float32)
    return save(tensors, metadata={"scale": repr(weights.scale)})


def write_mlx_folder(weights: AdapterWeights, path: str | Path, num_model_layers: int) -> Path:
    """Write ``adapters.safetensors`` + ``adapter_config.json`` that ``mlx_lm.load(adapter_path=...)``
    accepts, for any set of adapted modules of one rank.

    mlx-lm (``mlx_lm.tuner.utils.linear_to_lora_layers``) adds LoRA layers to the modules named in
    ``keys`` inside each of the last ``num_layers`` blocks (names relative to the block), and to
    every module of the whole model whose full path is in ``keys``; it then loads the tensors,
    leaving any LoRA layer without tensors at its zero ``lora_b`` (no change). So ``num_layers``
    runs from the first adapted block to the last block of the model, ``keys`` holds the union of
    the adapted names within blocks (hybrid models' blocks differ) and the full paths of adapted
    modules outside the blocks (OPT-350m's ``project_in``/``project_out``)."""
    per_layer: dict[int, set[str]] = {}
    outside = set()
    for p in weights.modules:
        m = re.match(r"^(?:.*\.)?(?:layers|h)\.(\d+)\.(.+)$", p)  # "h.N": GPT-2 / GPT-NeoX in mlx-lm
        if m:
            per_layer.setdefault(int(m.group(1)), set()).add(m.group(2))
        else:
            outside.add(p)
    if per_layer and max(per_layer) >= num_model_layers:
        raise AdapterError(f"the adapter has modules in block {max(per_layer)}, but the model has {num_model_layers} "
                           "blocks; pass the base model's block count (num_model_layers=) or its folder (base_model=)")
    if len({a.shape[1] for a, _ in weights.modules.values()}) != 1:
        raise AdapterError("mlx-lm format needs one rank for all modules; use the peft format")
    num_layers = num_model_layers - min(per_layer, default=num_model_layers)
    keys = set().union(*per_layer.values(), outside)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for p, (a, b) in weights.modules.items():
        tensors[f"{p}.lora_a"] = np.ascontiguousarray(a, dtype=np.float32)
        tensors[f"{p}.lora_b"] = np.ascontiguousarray(b, dtype=np.float32)
    save_file(tensors, str(path / "adapters.safetensors"))
    config = {"fine_tune_type": "lora", "num_layers": num_layers,
              "lora_parameters": {"rank": weights.rank, "scale": weights.scale, "dropout": 0.0, "keys": sorted(keys)}}
    (path / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return path
