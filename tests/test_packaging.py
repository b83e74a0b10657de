"""The wheel ships every subpackage; games/ and leagues/ install under autocurricula.*."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "autocurricula").rglob("__init__.py")}
    assert on_disk <= listed, on_disk - listed
    assert {"autocurricula.games", "autocurricula.leagues"} <= listed
    assert cfg["package-dir"]["autocurricula.games"] == "games" and "games" not in listed


def test_games_import_path():
    import autocurricula.games
    import autocurricula.leagues

    assert Path(autocurricula.games.__file__).parent.name == "games"
    assert autocurricula.leagues.__doc__
