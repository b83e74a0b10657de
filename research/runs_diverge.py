"""Where two runs of the same command part: the first game whose players or result differ, and
how many games differ per epoch; with ``--weights``, how far two cached models' weights are apart.

    OPENBLAS_CORETYPE=Haswell AUTOCURRICULA_CACHE=/tmp/haswell python examples/tictactoe_league.py \
        --seed 0 --output-dir runs/haswell                 # another CPU's BLAS kernels on this one
    python examples/tictactoe_league.py --seed 0 --output-dir runs/here
    python research/runs_diverge.py runs/here runs/haswell
    python research/runs_diverge.py --weights ~/.cache/autocurricula/tiny-h128-l2-a32-ttt-warm400 \
        /tmp/haswell/tiny-h128-l2-a32-ttt-warm400

OpenBLAS picks its kernels by CPU model; ``OPENBLAS_CORETYPE`` makes it use another model's on
this one, so the same seed, code and libraries run as they would on that CPU (to the BLAS calls;
MLX's own kernels are the same). docs/results_learn.md reads the tic-tac-toe example this way.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def games(run: Path) -> dict[str, tuple]:
    out = {}
    with open(run / "match_history.jsonl") as fh:
        for line in fh:
            row = json.loads(line)
            out[row["game_id"]] = (tuple(row["players"]), tuple(row["rewards"]))
    return out


def compare(a: Path, b: Path) -> dict:
    ga, gb = games(a), games(b)
    both = [g for g in ga if g in gb]
    differ = [g for g in both if ga[g] != gb[g]]
    per_epoch: dict[int, list[int]] = {}
    for g in both:
        epoch = int(g.split("-")[0][1:])  # game ids are e<epoch>-r<round>-m<match>-<k>
        counts = per_epoch.setdefault(epoch, [0, 0])
        counts[0] += 1
        counts[1] += ga[g] != gb[g]
    return {"games_in_both": len(both), "games_that_differ": len(differ),
            "first_that_differs": differ[0] if differ else None,
            "identical_before_it": both.index(differ[0]) if differ else len(both),
            "share_that_differs_per_epoch": {e: round(d / n, 4) for e, (n, d) in sorted(per_epoch.items())}}


def weights_apart(a: Path, b: Path) -> dict:
    import autocurricula  # noqa: F401  (BLAS before mlx)
    import mlx.core as mx

    wa, wb = mx.load(str(a / "model.safetensors")), mx.load(str(b / "model.safetensors"))
    if wa.keys() != wb.keys():
        raise SystemExit("the two models do not have the same tensors")
    worst = max(wa, key=lambda k: mx.max(mx.abs(wa[k] - wb[k])).item())
    diff = mx.max(mx.abs(wa[worst] - wb[worst])).item()
    return {"identical": all(mx.array_equal(wa[k], wb[k]).item() for k in wa), "max_abs_difference": diff,
            "tensor": worst, "relative_to_its_largest_weight": diff / max(mx.max(mx.abs(wa[worst])).item(), 1e-30)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--weights", action="store_true", help="a and b are model folders: compare their weights")
    args = parser.parse_args()
    print(json.dumps(weights_apart(args.a, args.b) if args.weights else compare(args.a, args.b)))


if __name__ == "__main__":
    main()
