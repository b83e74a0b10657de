"""PNG plots in ``output_dir``: Elo over time per player and the payoff-matrix heatmap."""

from __future__ import annotations

import io
from pathlib import Path

from autocurricula.files import atomic_write


def _plt():
    import matplotlib  # matplotlib: only when a plot is drawn, and its backend set before pyplot loads

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_elo(history: dict[str, list[tuple[int, float]]], path: str | Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for player, points in sorted(history.items()):
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, label=player, linewidth=1.2)
    ax.set_xlabel("rating update")
    ax.set_ylabel("Elo")
    ax.set_title("Elo over time")
    if 0 < len(history) <= 16 and any(history.values()):
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    _save(plt, fig, path)
    return Path(path)


def plot_payoff(players: list[str], matrix: list[list[float]], path: str | Path) -> Path:
    plt = _plt()
    n = len(players)
    fig, ax = plt.subplots(figsize=(1.2 + 0.55 * n, 1 + 0.5 * n))
    im = ax.imshow(matrix, vmin=0, vmax=1, cmap="RdBu")
    ax.set_xticks(range(n), players, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(n), players, fontsize=7)
    ax.set_title("win rate of row vs column")
    if n <= 12:
        for i in range(n):
            for j in range(n):
                ax.text(j, i, f"{matrix[i][j]:.2f}", ha="center", va="center", fontsize=6)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    _save(plt, fig, path)
    return Path(path)


def _save(plt, fig, path) -> None:
    """The figure as a PNG at ``path``, replaced atomically (never written through a link there)."""
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=110)
    finally:
        plt.close(fig)
    atomic_write(path, buf.getvalue())
