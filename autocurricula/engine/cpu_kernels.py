"""Fast paths for MLX's CPU backend, installed on a loaded model at engine start.

MLX's Linux CPU wheel has three slow spots that dominate small-model steps:

- quantized (``nn.QuantizedLinear`` / ``nn.QuantizedEmbedding``) and bf16/fp16 matmuls are
  slower than float32 ones and gain little from batching (docs/engine.md), so a quantized or
  half-precision base is converted to float32 once at load (:func:`to_float32`);
- transcendental functions run one element at a time (``exp`` calls libm per element), so
  SiLU in the SwiGLU MLP costs as much as the MLP's matmuls; :func:`fast_swiglu` computes it
  with a compiled rational ``tanh`` (multiplies and one divide, which the compiler vectorises).

Metal and CUDA keep their own kernels: :func:`prepare` does nothing off the CPU backend.
"""

from __future__ import annotations

import inspect
import logging
import os
import re

import mlx.core as mx
import mlx.nn as nn

log = logging.getLogger(__name__)

# Eigen's float tanh (generic_fast_tanh_float): odd 13/6 rational, exact to a few float32 ulps
# on [-9, 9]; beyond that float32 tanh is +-1 to within 2**-24.
_TANH_CLAMP = 7.90531110763549805
_ALPHA = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
          1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)
_BETA = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)

# Stated bound, checked on a dense grid by tests/test_cpu_paths.py:
# |fast_silu(x) - x * sigmoid(x)| <= SILU_ABS_TOL * max(1, |x|) for every float32 x.
SILU_ABS_TOL = 3e-7


def rational_tanh(x: mx.array) -> mx.array:
    """``tanh`` from a clamped rational approximation: only multiplies, adds and one divide."""
    x = mx.clip(x, -_TANH_CLAMP, _TANH_CLAMP)
    x2 = x * x
    p = x2 * _ALPHA[0] + _ALPHA[1]
    for c in _ALPHA[2:]:
        p = p * x2 + c
    q = x2 * _BETA[0] + _BETA[1]
    for c in _BETA[2:]:
        q = q * x2 + c
    return x * p / q


def _silu(x: mx.array) -> mx.array:
    # x * sigmoid(x) = x * (1 + tanh(x / 2)) / 2
    return x * (0.5 + 0.5 * rational_tanh(0.5 * x))


fast_silu = mx.compile(_silu)


@mx.compile
def _swiglu_fwd(gate: mx.array, x: mx.array) -> mx.array:
    return _silu(gate) * x


@mx.compile
def _swiglu_bwd(gate: mx.array, x: mx.array, cot: mx.array) -> tuple[mx.array, mx.array]:
    # d silu(g) / dg = s * (1 + g * (1 - s)) with s = sigmoid(g): one fused pass, where
    # differentiating the rational function op by op is slower than MLX's exact backward
    s = 0.5 + 0.5 * rational_tanh(0.5 * gate)
    return cot * x * s * (1 + gate * (1 - s)), cot * gate * s


@mx.custom_function
def _swiglu_f32(gate: mx.array, x: mx.array) -> mx.array:
    return _swiglu_fwd(gate, x)


@_swiglu_f32.vjp
def _swiglu_f32_vjp(primals, cotangent, output):
    gate, x = primals
    return _swiglu_bwd(gate, x, cotangent)


def fast_swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """``silu(gate) * x`` in float32 (the rational path loses its accuracy in half precision),
    with a fused backward for the update."""
    dtype = x.dtype
    if gate.dtype != mx.float32 or dtype != mx.float32:
        return _swiglu_f32(gate.astype(mx.float32), x.astype(mx.float32)).astype(dtype)
    return _swiglu_f32(gate, x)


def on_cpu() -> bool:
    """True when MLX runs on its CPU backend (no Metal, no CUDA device as default)."""
    return mx.default_device().type == mx.DeviceType.cpu


# ---------------------------------------------------------------- weights to float32
def _float_size(model) -> int:
    """Bytes the model's weights take in float32."""
    total = 0
    for _, mod in model.named_modules():
        if isinstance(mod, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            rows, cols = mod.weight.shape
            total += rows * cols * 32 // mod.bits * 4
            continue
        for name, v in mod.items():
            if isinstance(v, mx.array) and name not in ("scales", "biases"):
                total += v.size * 4
    return total


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _dequantized(mod) -> mx.array:
    return mx.dequantize(mod.weight, mod.scales, mod.get("biases"), mod.group_size, mod.bits,
                         mode=getattr(mod, "mode", "affine")).astype(mx.float32)


def to_float32(model) -> dict:
    """Replace quantized linears/embeddings by float32 ones holding the dequantized weights and
    cast half-precision weights to float32, in place. Returns counts of what changed."""
    counts = {"dequantized": 0, "upcast": 0}
    for path, mod in list(model.named_modules()):
        if isinstance(mod, nn.QuantizedLinear):
            w = _dequantized(mod)
            new = nn.Linear(w.shape[1], w.shape[0], bias="bias" in mod)
            new.weight = w
            if "bias" in mod:
                new.bias = mod.bias.astype(mx.float32)
        elif isinstance(mod, nn.QuantizedEmbedding):
            w = _dequantized(mod)
            new = nn.Embedding(w.shape[0], w.shape[1])
            new.weight = w
        else:
            continue
        _replace(model, path, new)
        counts["dequantized"] += 1
    half = {}
    for name, v in _flat(model.parameters()):
        if v.dtype in (mx.bfloat16, mx.float16):
            half[name] = v.astype(mx.float32)
    if half:
        model.load_weights(list(half.items()), strict=False)
        counts["upcast"] = len(half)
    mx.eval(model.parameters())
    return counts


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flat(v, f"{prefix}{k}.")
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _flat(v, f"{prefix}{i}.")
    elif isinstance(tree, mx.array):
        yield prefix[:-1], tree


def _replace(model, path: str, new) -> None:
    parent_path, _, attr = path.rpartition(".")
    parent = dict(model.named_modules())[parent_path] if parent_path else model
    if isinstance(parent, list):
        parent[int(attr)] = new
    else:
        setattr(parent, attr, new)


# ---------------------------------------------------------------- SwiGLU MLPs
# mlx-lm's llama/qwen2/qwen3/mistral MLPs: down(swiglu(gate(x), up(x))) or down(silu(gate(x)) * up(x)).
_SWIGLU_BODY = re.compile(
    r"return\s+self\.down_proj\(\s*(?:swiglu\(\s*self\.gate_proj\(x\),\s*self\.up_proj\(x\)\s*\)"
    r"|nn\.silu\(\s*self\.gate_proj\(x\)\s*\)\s*\*\s*self\.up_proj\(x\))\s*\)")
_FAST_CLASSES: dict[type, type] = {}


def _fast_mlp_call(self, x):
    return self.down_proj(fast_swiglu(self.gate_proj(x), self.up_proj(x)))


def _is_swiglu_mlp(cls) -> bool:
    try:
        src = inspect.getsource(cls.__call__)
    except (OSError, TypeError):
        return False
    body = [line.strip() for line in src.splitlines()[1:] if line.strip() and not line.strip().startswith("#")]
    return len(body) == 1 and _SWIGLU_BODY.fullmatch(body[0]) is not None


def install_fast_mlp(model) -> int:
    """Give every SwiGLU MLP of ``model`` the rational SiLU (a subclass with the same modules, so
    parameter paths and adapters are unchanged); returns how many MLPs were switched. MLPs whose
    ``__call__`` is anything but mlx-lm's plain SwiGLU are left alone."""
    n = 0
    for _, mod in model.named_modules():
        cls = type(mod)
        if cls in _FAST_CLASSES.values():
            n += 1
            continue
        if not all(hasattr(mod, k) for k in ("gate_proj", "up_proj", "down_proj")):
            continue
        fast = _FAST_CLASSES.get(cls)
        if fast is None:
            if not _is_swiglu_mlp(cls):
                continue
            fast = _FAST_CLASSES[cls] = type(f"FastSiLU{cls.__name__}", (cls,), {"__call__": _fast_mlp_call})
        mod.__class__ = fast
        n += 1
    return n


def uninstall_fast_mlp(model) -> int:
    """Undo :func:`install_fast_mlp` (tests compare both paths on one model)."""
    n = 0
    for _, mod in model.named_modules():
        if type(mod) in _FAST_CLASSES.values():
            mod.__class__ = type(mod).__mro__[1]
            n += 1
    return n


def prepare(model, keep_quantized: bool = False, fast_kernels: bool = True) -> dict:
    """Apply the CPU fast paths to a loaded mlx-lm model (no-op off the CPU backend) and return a
    summary for logs and metrics: ``weights`` is ``"float32"``, ``"as stored"`` or the reason
    they were kept, ``fast_silu_mlps`` how many MLPs use :func:`fast_swiglu`."""
    if not on_cpu():
        return {"backend": str(mx.default_device()), "weights": "as stored", "fast_silu_mlps": 0}
    info = {"backend": "cpu", "weights": "as stored", "fast_silu_mlps": 0}
    if not keep_quantized:
        need, total = _float_size(model), _memory_bytes()
        if total is not None and need > total // 2:
            info["weights"] = (f"as stored: float32 weights would take {need / 2**30:.1f} GiB, over half "
                               f"of this machine's {total / 2**30:.1f} GiB")
        else:
            counts = to_float32(model)
            info.update(counts)
            info["weights"] = "float32" if any(counts.values()) else "as stored"
    if fast_kernels:
        info["fast_silu_mlps"] = install_fast_mlp(model)
    return info


def describe() -> str:
    """What engines of this process do at load (``autocurricula env``)."""
    if not on_cpu():
        return f"off ({mx.default_device()}: stored weights and MLX's kernels)"
    return ("CPU backend: quantized and bf16/fp16 bases become float32 at load (serve --keep-quantized / "
            "EngineConfig.keep_quantized keeps them); SwiGLU uses the rational SiLU (EngineConfig.cpu_fast_kernels)")
