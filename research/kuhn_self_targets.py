"""How far a trained Kuhn poker policy sits from its own self-play soft target, with exact values.

    python research/kuhn_self_targets.py LOG [--epoch N] [--tau 0.15]

``LOG`` holds the JSON lines of ``research/league_config_elsewhere.py --game kuhn``; the main
agent's P(bet or call) per information set after epoch ``N`` (default the last) is read from its
``main_agent_policy`` (three decimals; invalid replies are not in it). For each set the script
prints that probability, the exact value gap of the aggressive over the passive move when the
policy plays itself (``kuhn_moves_fixed_point.move_values``), the soft target ``softmax(Q / tau)``
at that gap, and the soft targets' own fixed point (``fixed_point``, no bound). A policy at its
self-play soft target is where soft targets in self-play would leave it; a set far from it is
held there by something else: values against other opponents, or the fit. One JSON line.
"""

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from autocurricula.eval.kuhn import INFOSETS, exploitability  # noqa: E402
from kuhn_moves_fixed_point import fixed_point, move_values, target  # noqa: E402


def read_policy(path: str, epoch: int | None = None) -> tuple[int, dict[str, float]]:
    """The main agent's (epoch, P(bet or call) per set) after ``epoch`` (None: the last logged)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        start = line.find("{")  # a progress bar written to the same file can precede a JSON row
        if start < 0:
            continue
        try:
            row = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "main_agent_policy" in row and (epoch is None or row["epoch"] == epoch):
            rows.append(row)
    if not rows:
        raise SystemExit(f"{path}: no main_agent_policy line{'' if epoch is None else f' for epoch {epoch}'}: "
                         "give the output of research/league_config_elsewhere.py --game kuhn")
    return rows[-1]["epoch"], {k: float(rows[-1]["main_agent_policy"][k]) for k in INFOSETS}


def self_targets(policy: dict[str, float], tau: float) -> dict[str, dict[str, float]]:
    """Per set: the policy's P, its self-play value gap (aggressive - passive) and the soft target's P."""
    q = move_values(policy)
    return {k: {"p": policy[k], "gap": q[k][0] - q[k][1], "target": target(q[k], tau, math.inf)} for k in INFOSETS}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log")
    p.add_argument("--epoch", type=int, default=None)
    p.add_argument("--tau", type=float, default=0.15, help="the soft targets' temperature")
    p.add_argument("--iterations", type=int, default=4000, help="steps of 0.05 toward the fixed point")
    args = p.parse_args(argv)
    if not args.tau >= 0.01:
        p.error(f"--tau must be at least 0.01 (a Kuhn value gap is at most 3 chips), got {args.tau}")
    epoch, policy = read_policy(args.log, args.epoch)
    rows = self_targets(policy, args.tau)
    fixed = fixed_point(args.tau, math.inf, args.iterations)
    print(json.dumps({"epoch": epoch, "tau": args.tau,
                      "exploitability": round(exploitability(policy, backend="python"), 4),
                      "fixed_point_exploitability": round(exploitability(fixed, backend="python"), 4),
                      "sets": {k: {**{n: round(v, 3) for n, v in r.items()}, "fixed_point": round(fixed[k], 3)}
                               for k, r in rows.items()}}))


if __name__ == "__main__":
    main()
