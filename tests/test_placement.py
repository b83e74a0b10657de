"""The placement policy shared by RemoteEngine and RayEngine: sticky per player, new players to the
worker with the fewest players, the base model to the least busy one."""

from types import SimpleNamespace

from autocurricula.fleet.placement import pick_worker


def workers(*inflight):
    return [SimpleNamespace(index=i, inflight=n) for i, n in enumerate(inflight)]


def test_new_players_spread_and_stay_where_they_were_placed():
    a, b = workers(0, 0)
    placement = {}
    assert pick_worker([a, b], placement, "p1") is a
    assert pick_worker([a, b], placement, "p2") is b  # a already has one player
    a.inflight = 9
    assert pick_worker([a, b], placement, "p1") is a  # sticky however busy
    assert placement == {"p1": a, "p2": b}


def test_ties_go_to_the_least_busy_worker_and_the_base_model_is_not_placed():
    a, b = workers(3, 1)
    placement = {}
    assert pick_worker([a, b], placement, None) is b
    assert placement == {}
    assert pick_worker([a, b], placement, "p") is b


def test_a_player_whose_worker_is_down_moves_and_nothing_up_gives_none():
    a, b = workers(0, 0)
    placement = {"p": a}
    assert pick_worker([b], placement, "p") is b and placement["p"] is b
    assert pick_worker([], placement, "p") is None


def test_a_custom_key_counts_players_per_worker():
    a, b = workers(0, 0)
    placement = {"x": a, "y": a}
    assert pick_worker([a, b], placement, "z", key=lambda w: w.index) is b
