"""BLAS threads: `serve --threads`, `AutocurriculumConfig.threads` / `train --threads`, and the
OpenBLAS setting they change (restored after train())."""

import pytest

from autocurricula.engine import blas as _blas
def test_set_threads_changes_the_preloaded_openblas():
    if _blas.ACTIVE["library"] is None:
        assert _blas.set_threads(1) is False and _blas.get_threads() is None  # nothing to set: said so
        return
    before = _blas.get_threads()
    try:
        assert _blas.set_threads(1) is True and _blas.get_threads() == 1
        assert "1 threads" in _blas.describe()
    finally:
        _blas.set_threads(before)
    for bad in (0, -2, 1.5, True, "2"):
        with pytest.raises(ValueError, match="positive integer"):
            _blas.set_threads(bad)


def test_train_runs_on_config_threads_and_gives_the_previous_count_back(tiny_model_path, tmp_path, monkeypatch):
    from autocurricula import AutocurriculumConfig, SelfPlayConfig, SelfPlayTrainer
    from toy_games import digits

    with pytest.raises(ValueError, match="threads"):
        AutocurriculumConfig(threads=0)
    calls = []
    real = _blas.set_threads
    monkeypatch.setattr(_blas, "set_threads", lambda n: calls.append(n) or real(n))
    monkeypatch.setattr(_blas, "get_threads", lambda: 2)
    seen = []

    async def play(players, model, tokenizer=None):
        seen.append(calls[-1] if calls else None)  # the count in force while games run
        return await digits(players, model, tokenizer)

    t = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=1, rules={"games_per_round": 2}, output_dir=str(tmp_path),
                                       progress=False, max_tokens=2, save_strategy="no", threads=1))
    t.train(str(tiny_model_path), play)
    t.engine.close()
    assert seen and set(seen) == {1} and calls == [1, 2]  # set for the run, then the previous count back


def test_cli_passes_threads_to_serve_and_train(monkeypatch, tiny_model_path, tmp_path):
    import autocurricula.serve.server as server
    from autocurricula import cli

    seen = []
    monkeypatch.setattr(server, "serve", lambda model, **kw: seen.append(kw["threads"]))
    for argv, want in ((["--threads", "1"], 1), ([], None)):
        args = cli.build_parser().parse_args(["serve", "--model", str(tiny_model_path), *argv])
        args.func(args)
        assert seen.pop() == want
    configs = []

    class Stop(Exception):
        pass

    def fake_train(self, *a, **k):
        configs.append(self.config)
        raise Stop

    from autocurricula.loop import trainer
    monkeypatch.setattr(trainer.AutocurriculumTrainer, "train", fake_train)
    args = cli.build_parser().parse_args(["train", "--model", str(tiny_model_path), "--game", "tictactoe", "--league", "league",
                                          "--threads", "1", "--output-dir", str(tmp_path / "o")])
    with pytest.raises(Stop):
        args.func(args)
    assert configs[0].threads == 1
