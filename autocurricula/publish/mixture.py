"""A league's deployable mixture as a folder: ``mixture.json`` and one adapter folder per player.

``trainer.export_mixture(folder)`` and ``trainer.push_to_hub`` write it (:func:`mixture_document`);
``autocurricula serve --mixture NAME=FOLDER``, ``POST /v1/load_mixture`` and
:func:`load_mixture` read it (:func:`read_mixture`), and refuse anything that cannot be played as
written, by name and with the fix (:class:`MixtureError`):

- ``mixture.json`` is a JSON object, a regular file inside the folder, whose ``weights`` map adapter
  names (player ids, as :func:`~autocurricula.engine.adapters.check_name` allows) to weights that
  are finite, non-negative and sum to 1 within :data:`TOLERANCE`;
- every adapter it names is a folder ``<folder>/<name>`` with ``adapter_config.json`` and the
  weights of a peft (``adapter_model.safetensors``) or mlx-lm (``adapters.safetensors``) adapter,
  and nothing in it (folder, files, symlinks) resolves outside the mixture folder;
- ``base_model``, ``format`` and ``game``, when present, are strings (``format``: peft or mlx).

A mixed strategy is played by drawing one pure policy per game, at its start, by the weights:
:class:`MixturePolicy` does so with a seedable generator (the server draws with it too, once per
conversation).
"""

from __future__ import annotations

import json
import math
import os
import random
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from autocurricula.engine.adapters import AdapterError, check_name, load_folder

__all__ = ["MIXTURE_FILE", "TOLERANCE", "Mixture", "MixtureError", "MixturePolicy", "check_weights", "load_mixture",
           "mixture_document", "read_mixture", "serve_command"]

MIXTURE_FILE = "mixture.json"
TOLERANCE = 1e-6  # |sum of the weights - 1| allowed
MAX_FILE_BYTES = 1 << 20  # a mixture.json larger than this is not one trainer.export_mixture wrote
FORMATS = ("peft", "mlx")
WEIGHT_FILES = ("adapter_model.safetensors", "adapters.safetensors")


class MixtureError(AdapterError):
    """A mixture folder or ``mixture.json`` that cannot be played as written; the message names the
    folder, the problem and the fix. An :class:`~autocurricula.engine.adapters.AdapterError`, so the
    server answers it with a 400 and the CLI with one line."""


def check_weights(weights, where: str = MIXTURE_FILE) -> dict[str, float]:
    """``weights`` as ``{adapter name: float}`` when they are a mixture: a non-empty object of
    valid adapter names to finite, non-negative numbers summing to 1 within :data:`TOLERANCE`; a
    :class:`MixtureError` naming the first problem (``where``: the file, for the message) otherwise."""
    if not isinstance(weights, Mapping) or not weights:
        raise MixtureError(f"{where}: 'weights' must be a non-empty object of adapter name -> weight, got "
                           f"{_short(weights)}; write it as trainer.export_mixture(folder) does, e.g. "
                           '{"weights": {"main_agent-1": 0.6, "main_exploiter-0": 0.4}}')
    out = {}
    for name, w in weights.items():
        try:
            check_name(name)
        except AdapterError as exc:
            raise MixtureError(f"{where}: {exc}; the weights' keys are the adapters' folder names") from None
        if isinstance(w, bool) or not isinstance(w, (int, float)):
            raise MixtureError(f"{where}: the weight of {name!r} is {_short(w)}, not a number; write a number in "
                               "[0, 1]")
        if not math.isfinite(w):
            raise MixtureError(f"{where}: the weight of {name!r} is {w}, not finite; write a number in [0, 1]")
        if w < 0:
            raise MixtureError(f"{where}: the weight of {name!r} is {w}, negative; weights are probabilities in "
                               "[0, 1] (leave out an adapter never to be drawn, or give it 0)")
        out[name] = float(w)
    total = math.fsum(out.values())
    if abs(total - 1.0) > TOLERANCE:
        raise MixtureError(f"{where}: the weights sum to {total:.10g}, not 1 (within {TOLERANCE:g}); divide each by "
                           "their sum, or export the mixture again with trainer.export_mixture(folder)")
    return out


def mixture_document(weights: Mapping[str, float], base_model: str | None, format: str = "peft",
                     game: str | None = None) -> str:
    """The text of ``mixture.json``: the weights (divided by their sum, so rounding in the solver
    cannot put them outside :data:`TOLERANCE`), the base model, the adapters' format and the game."""
    total = math.fsum(float(w) for w in weights.values())
    scaled = {k: float(w) / total for k, w in weights.items()} if total > 0 and math.isfinite(total) else dict(weights)
    return json.dumps({"weights": scaled, "base_model": None if base_model is None else str(base_model),
                       "format": format, "game": game}, indent=2)


@dataclass(frozen=True)
class Mixture:
    """A checked mixture folder: ``weights`` by adapter name (in the file's order), each adapter's
    resolved folder, and what ``mixture.json`` says of the base model, format and game."""

    folder: Path
    weights: dict[str, float]
    adapters: dict[str, Path]
    base_model: str | None = None
    format: str | None = None
    game: str | None = None

    @property
    def names(self) -> list[str]:
        return list(self.weights)


def read_mixture(folder: str | os.PathLike) -> Mixture:
    """Read and check the mixture ``folder`` (module docstring); a :class:`MixtureError` naming the
    problem and the fix otherwise. Reads no tensors."""
    given = Path(folder).expanduser()
    if not given.is_dir():
        raise MixtureError(f"mixture folder {str(given)!r} does not exist or is not a folder; give the folder "
                           "trainer.export_mixture(folder) wrote (it holds mixture.json)")
    top = Path(os.path.realpath(given))
    path = given / MIXTURE_FILE
    if not path.exists() and not path.is_symlink():
        raise MixtureError(f"{given} has no {MIXTURE_FILE}; give the folder trainer.export_mixture(folder) wrote, or "
                           "export it again")
    _check_inside(path, top, f"{MIXTURE_FILE} of {given}")
    if not path.is_file():
        raise MixtureError(f"{path} is not a file; write mixture.json as trainer.export_mixture(folder) does")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise MixtureError(f"{path} holds {path.stat().st_size} bytes, more than a mixture ({MAX_FILE_BYTES}); "
                           "export it again with trainer.export_mixture(folder)")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise MixtureError(f"{path} is not valid JSON ({type(exc).__name__}: {exc}); export it again with "
                           "trainer.export_mixture(folder)") from None
    if not isinstance(doc, dict):
        raise MixtureError(f"{path} holds a JSON {type(doc).__name__}; it must be an object with 'weights' "
                           '(e.g. {"weights": {"main_agent-1": 1.0}, "base_model": "..."})')
    if "weights" not in doc:
        raise MixtureError(f"{path} has no 'weights'; write the adapters' weights as "
                           '{"weights": {"main_agent-1": 0.6, "main_exploiter-0": 0.4}}')
    weights = check_weights(doc["weights"], str(path))
    meta = {}
    for key in ("base_model", "format", "game"):
        value = doc.get(key)
        if value is not None and not isinstance(value, str):
            raise MixtureError(f"{path}: {key!r} is {_short(value)}, not a string; write a string or leave it out")
        meta[key] = value
    if meta["format"] is not None and meta["format"] not in FORMATS:
        raise MixtureError(f"{path}: format {meta['format']!r} is not one of {', '.join(FORMATS)}; export the mixture "
                           "with trainer.export_mixture(folder, format='peft') or format='mlx'")
    adapters = {name: _adapter_folder(given, top, name) for name in weights}
    return Mixture(top, weights, adapters, **meta)


def _adapter_folder(given: Path, top: Path, name: str) -> Path:
    """The checked folder of adapter ``name`` (module docstring)."""
    sub = given / name
    if not sub.exists() and not sub.is_symlink():
        raise MixtureError(f"mixture {given}: adapter {name!r} is missing (no folder {sub}); export the mixture again "
                           "with trainer.export_mixture(folder), or remove it from mixture.json's weights and "
                           "rescale the others")
    real = _check_inside(sub, top, f"adapter {name!r} of mixture {given}")
    if not real.is_dir():
        raise MixtureError(f"mixture {given}: adapter {name!r} ({sub}) is not a folder; it must be the adapter "
                           "folder trainer.export wrote")
    for entry in os.scandir(real):
        _check_inside(Path(entry.path), top, f"{entry.name} of adapter {name!r} of mixture {given}")
    if not (real / "adapter_config.json").is_file() or not any((real / f).is_file() for f in WEIGHT_FILES):
        raise MixtureError(f"mixture {given}: adapter {name!r} ({sub}) has no adapter_config.json with "
                           "adapter_model.safetensors (peft) or adapters.safetensors (mlx-lm); export the mixture "
                           "again with trainer.export_mixture(folder)")
    return real


def _check_inside(path: Path, top: Path, what: str) -> Path:
    """``path`` resolved (symlinks followed); a MixtureError when that leaves ``top``."""
    real = Path(os.path.realpath(path))
    if os.path.commonpath([str(top), str(real)]) != str(top):
        raise MixtureError(f"{what} resolves to {real}, outside the mixture folder {top}; copy the files into the "
                           "mixture folder instead of linking them")
    return real


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass
class MixturePolicy:
    """A mixed strategy over adapters, for Python games and evaluation (``autocurricula.load_mixture``).

    ``draw()`` gives one adapter name per game or episode, by the weights, from its own
    ``random.Random(seed)``: the same seed gives the same draws. ``load_into(engine)`` loads the
    adapters into an :class:`~autocurricula.engine.Engine` as players, so the drawn name plays."""

    mixture: Mixture
    seed: int | None = None
    rng: random.Random = field(init=False, repr=False)

    def __post_init__(self):
        self.rng = random.Random(self.seed)
        self._names = self.mixture.names
        self._cum = []
        total = 0.0
        for name in self._names:
            total += self.mixture.weights[name]
            self._cum.append(total)

    @property
    def names(self) -> list[str]:
        """The adapters, in mixture.json's order."""
        return list(self._names)

    @property
    def weights(self) -> dict[str, float]:
        """``{adapter name: weight}``."""
        return dict(self.mixture.weights)

    @property
    def folder(self) -> Path:
        return self.mixture.folder

    @property
    def base_model(self) -> str | None:
        return self.mixture.base_model

    def adapter_folder(self, name: str) -> Path:
        """The folder of adapter ``name``."""
        return self.mixture.adapters[name]

    def draw(self, rng: random.Random | None = None) -> str:
        """One adapter name, drawn by the weights (``rng``: another generator than the policy's own).
        An adapter of weight 0 is never drawn."""
        u = (rng or self.rng).random() * self._cum[-1]
        for name, edge in zip(self._names, self._cum):
            if u < edge:
                return name
        return next(n for n in reversed(self._names) if self.mixture.weights[n] > 0)  # u at the top edge: rounding

    def load_into(self, engine, prefix: str = "") -> dict[str, str]:
        """Load every adapter into ``engine`` as player ``prefix + name``; returns ``{name: player}``."""
        players = {}
        for name in self._names:
            player = check_name(prefix + name)
            engine.load_adapter(player, load_folder(self.mixture.adapters[name], str(self.mixture.folder)))
            players[name] = player
        return players


def load_mixture(folder: str | os.PathLike, seed: int | None = None) -> MixturePolicy:
    """The mixture ``trainer.export_mixture(folder)`` wrote (or a Hub league repo downloaded), checked
    (:func:`read_mixture`), as a :class:`MixturePolicy` whose draws follow ``seed``."""
    return MixturePolicy(read_mixture(folder), seed)


def serve_command(base_model: str | None, name: str, folder: str) -> str:
    """The ``autocurricula serve`` command that serves mixture ``folder`` as model ``name``."""
    model = shlex.quote(str(base_model)) if base_model else "BASE_MODEL"
    return f"autocurricula serve --model {model} --mixture {shlex.quote(f'{name}={folder}')}"
