"""``autocurricula`` command line: serve | tiny-model | env | bench."""

from __future__ import annotations

import argparse
import json
import sys


def _env(args) -> None:
    import platform

    import autocurricula
    from autocurricula import _blas
    from autocurricula.bench.engine import gemm_ceiling

    import mlx.core as mx

    info = {"autocurricula": autocurricula.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "mlx": mx.__version__, "device": str(mx.default_device()),
            "blas": _blas.describe(), "gemm_gflops": round(gemm_ceiling(sizes=(1024,), seconds=0.3) / 1e9, 1)}
    for mod in ("mlx_lm", "transformers", "peft", "trl", "torch"):
        try:
            info[mod] = __import__(mod).__version__
        except ImportError:
            info[mod] = None
    print(json.dumps(info, indent=2) if args.json else "\n".join(f"{k:<14} {v}" for k, v in info.items()))


def _tiny(args) -> None:
    from autocurricula.tiny import build_tiny_model

    path = build_tiny_model(args.path, model_type=args.model_type, hidden_size=args.hidden, num_layers=args.layers,
                            vocab_size=args.vocab, quantize_bits=args.quantize_bits, overwrite=args.overwrite)
    print(path)


def _serve(args) -> None:
    from autocurricula.server import serve

    serve(args.model, host=args.host, port=args.port, api_key=args.api_key, max_slots=args.max_slots,
          adapter_root=args.adapter_root, served_model_name=args.served_model_name, max_batch=args.max_batch)


def _bench(args) -> None:
    if args.what == "engine":
        from autocurricula.bench.engine import main
    else:
        from autocurricula.bench.train import main
    main(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autocurricula", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="OpenAI-compatible multi-LoRA server")
    s.add_argument("--model", required=True, help="Hugging Face id or local folder (mlx-lm format or HF safetensors)")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every route but /health")
    s.add_argument("--max-slots", type=int, default=16, help="adapters resident at once (LRU beyond)")
    s.add_argument("--adapter-root", default=None, help="folder that /v1/load_lora_adapter paths must lie under")
    s.add_argument("--served-model-name", default=None, help="the base model's name in the API (default: --model)")
    s.add_argument("--max-batch", type=int, default=64, help="rows decoded together in one step")
    s.set_defaults(func=_serve)

    t = sub.add_parser("tiny-model", help="write the built-in tiny model (no download)")
    t.add_argument("path")
    t.add_argument("--model-type", default="llama", choices=["llama", "qwen2"])
    t.add_argument("--hidden", type=int, default=256)
    t.add_argument("--layers", type=int, default=4)
    t.add_argument("--vocab", type=int, default=1024)
    t.add_argument("--quantize-bits", type=int, default=None, help="also convert with mlx-lm (e.g. 4)")
    t.add_argument("--overwrite", action="store_true")
    t.set_defaults(func=_tiny)

    e = sub.add_parser("env", help="versions, device, active BLAS and matmul speed")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=_env)

    b = sub.add_parser("bench", help="benchmarks (ratios measured side by side)")
    b.add_argument("what", choices=["engine", "train"])
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.add_argument("--model", default=None, help="model id/folder instead of the tiny bench model")
    b.add_argument("--hidden", type=int, default=256)
    b.add_argument("--layers", type=int, default=4)
    b.add_argument("--batch", type=int, default=64)
    b.add_argument("--new-tokens", type=int, default=48)
    b.add_argument("--quick", action="store_true", help="fewer repeats (CI smoke run)")
    b.set_defaults(func=_bench)
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    sys.exit(main())
