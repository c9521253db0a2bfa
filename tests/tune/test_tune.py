import json
import os
import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.kernels.configs import SDDMM_SPACE, SPMM_SPACE, in_space, sddmm_candidates, spmm_candidates
from sparsegnn.tune import autotune, decide, lookup, set_timer, tuner_invocations
from sparsegnn.tune.features import GraphStats, graph_stats, graph_stats_cached, signature
from sparsegnn.tune.model import CostModel, build_inputs, load_model
from sparsegnn.tune.store import store_for_device



def _graph(seed=0, n=200, e=1500):
    ei, w = sg.datasets.random_graph(n, e, seed=seed, weighted=True, num_empty_rows=3, num_self_loops=2)
    return Graph.from_edge_index(ei, w, num_nodes=n)


def test_graph_stats_match_numpy():
    g = _graph()
    s = graph_stats(g.rowptr, g.col, g.row)
    deg = np.diff(g.rowptr.numpy())
    assert s.num_nodes == 200 and s.num_edges == g.num_edges and s.deg_max == deg.max()
    assert s.deg_mean == pytest.approx(deg.mean(), rel=1e-5) and s.deg_std == pytest.approx(deg.std(), rel=1e-4)
    assert s.empty_frac == pytest.approx((deg == 0).mean())
    dist = np.abs(g.row.numpy() - g.col.numpy())
    assert s.local_frac == pytest.approx((dist < 64).mean(), rel=1e-5)
    assert graph_stats(g.rowptr, g.col) == s               # row expanded from rowptr when not given


def test_a_bipartite_graph_gathers_from_its_sources():
    """A bipartite graph's statistics keep its source count, and the cost model's inputs on the
    gathered matrix (its bytes, its slice against L2) read it; the row statistics are those of a
    square graph with the same rows, and a square graph's inputs are as before."""
    from sparsegnn.tune.model import INPUT_NAMES

    ei, _ = sg.datasets.random_graph(200, 1500, seed=4)
    square = Graph.from_edge_index(ei, num_nodes=200)
    wide = Graph.from_edge_index(ei * torch.tensor([[5], [1]]), num_nodes=200, num_src=1000)
    s, b = graph_stats_cached(square), graph_stats_cached(wide)
    assert s.num_src == -1 and s.sources == 200 and b.num_src == 1000 and b.sources == 1000
    assert (s.num_edges, s.deg_mean, s.deg_max, s.deg_p90) == (b.num_edges, b.deg_mean, b.deg_max, b.deg_p90)
    cands = [{"FLAT": 1, "BLOCK_E": 8, "BLOCK_F": 32, "num_warps": 1}]
    a, c = build_inputs(s, 64, 4, cands)[0], build_inputs(b, 64, 4, cands)[0]
    names = list(INPUT_NAMES)
    for name, ratio in (("log_x_bytes", 5), ("log_x_slice_over_l2", 5)):
        i = names.index(name)
        assert 2 ** c[i] - 1 == pytest.approx(ratio * (2 ** a[i] - 1), rel=1e-9)
    rest = [i for i, name in enumerate(names) if name not in ("log_x_bytes", "log_x_slice_over_l2", "local_frac",
                                                               "window_frac")]
    assert np.allclose(a[rest], c[rest])


def _drift(col: np.ndarray) -> np.ndarray:
    return np.abs(col - np.sort(col))


def test_a_bipartite_graphs_locality_follows_its_edge_order():
    """A bipartite graph's targets and sources are numbered apart, so its locality is measured
    along the edge order (``|col[k] - sorted(col)[k]|`` against numpy): sources handed out in
    the order of the targets' edges read as local, the same edges with shuffled source ids
    read ~1/32 within the M / 64 window; every other statistic is the same for both."""
    items = torch.sort(torch.randint(0, 300, (6000,), generator=torch.Generator().manual_seed(5))).values
    users = torch.sort(torch.randint(0, 2000, (6000,), generator=torch.Generator().manual_seed(6))).values
    ordered = Graph.from_edge_index(torch.stack([users, items]), num_nodes=300, num_src=2000)
    shuffled_ids = torch.randperm(2000, generator=torch.Generator().manual_seed(7))
    shuffled = Graph.from_edge_index(torch.stack([shuffled_ids[users], items]), num_nodes=300, num_src=2000)
    a, b = graph_stats_cached(ordered), graph_stats_cached(shuffled)
    for g, s in ((ordered, a), (shuffled, b)):
        drift = _drift(g.col.numpy())
        assert s.local_frac == pytest.approx((drift < 64).mean(), rel=1e-6)
        assert s.window_frac == pytest.approx((drift < 2000 // 64).mean(), rel=1e-6)
    assert a.local_frac == a.window_frac == 1.0 and b.window_frac < 0.1
    assert (a.num_edges, a.deg_mean, a.deg_max, a.deg_p99, a.hub_share) == \
        (b.num_edges, b.deg_mean, b.deg_max, b.deg_p99, b.hub_share)


def test_an_ordered_bipartite_graph_is_local_whatever_its_source_degrees():
    """Sources read in increasing order along the edges are local however unevenly their edges
    spread: half the users with 8x the edges of the others, and only every third user used."""
    gen = torch.Generator().manual_seed(10)
    weights = torch.where(torch.arange(900) % 2 == 0, 8.0, 1.0)
    users = torch.sort(torch.multinomial(weights, 6000, replacement=True, generator=gen) * 3).values
    items = torch.sort(torch.randint(0, 300, (6000,), generator=gen)).values
    ordered = graph_stats_cached(Graph.from_edge_index(torch.stack([users, items]), num_nodes=300, num_src=2700))
    shuffled_ids = torch.randperm(2700, generator=gen)
    shuffled = graph_stats_cached(Graph.from_edge_index(torch.stack([shuffled_ids[users], items]), num_nodes=300,
                                                        num_src=2700))
    assert ordered.local_frac == ordered.window_frac == 1.0
    assert shuffled.window_frac < 0.1


def test_a_large_bipartite_graphs_locality_reads_every_step_th_edge(monkeypatch):
    """Above ``DRIFT_SAMPLE`` edges the locality reads evenly spaced edges (no random state),
    sorted among themselves."""
    from sparsegnn.tune import features

    monkeypatch.setattr(features, "DRIFT_SAMPLE", 700)
    users = torch.randint(0, 2000, (6000,), generator=torch.Generator().manual_seed(8))
    items = torch.randint(0, 300, (6000,), generator=torch.Generator().manual_seed(9))
    g = Graph.from_edge_index(torch.stack([users, items]), num_nodes=300, num_src=2000)
    step = -(-g.num_edges // 700)
    drift = _drift(g.col.numpy()[::step])
    s = features.graph_stats(g.rowptr, g.col, None, 2000)
    assert s.window_frac == pytest.approx((drift < 2000 // 64).mean(), rel=1e-6)
    assert s.local_frac == pytest.approx((drift < 64).mean(), rel=1e-6)


def test_signature_groups_same_class_and_splits_others():
    a, b = _graph(seed=1), _graph(seed=2)                # same sizes and law, other edges
    assert signature(graph_stats_cached(a)) == signature(graph_stats_cached(b))
    c = _graph(seed=1, n=200, e=6000)                     # 4x the edges
    assert signature(graph_stats_cached(a)) != signature(graph_stats_cached(c))
    hub = Graph.from_edge_index(torch.cat([a.edge_index(), torch.stack([torch.arange(200), torch.zeros(200, dtype=torch.long)])], 1),
                                num_nodes=200)
    assert signature(graph_stats_cached(a)) != signature(graph_stats_cached(hub))   # a hub changes the class


def test_decide_tunes_once_per_graph_and_persists(fresh_store):
    timed = []

    def timer(run, cfg):
        timed.append(cfg)
        return 1.0 + 0.1 * len(timed) if cfg.get("A") != 2 else 0.5   # A=2 is the fastest

    set_timer(timer)
    cands = [{"A": 1}, {"A": 2}, {"A": 3}]
    before = tuner_invocations()
    g1 = _graph(seed=1)
    os.environ["SPARSEGNN_TUNE"] = "exhaustive"
    try:
        assert decide("toy", g1, "d", 16, torch.float32, "cpu", cands, lambda c: None) == {"A": 2}
        assert len(timed) == 3 and tuner_invocations() == before + 1
        # another Graph object of the same structure: no new tuning
        g1b = Graph.from_edge_index(g1.edge_index(), g1.edge_val, num_nodes=g1.num_nodes)
        assert decide("toy", g1b, "d", 16, torch.float32, "cpu", cands, lambda c: None) == {"A": 2}
        assert len(timed) == 3 and tuner_invocations() == before + 1
        # other width: new decision
        decide("toy", g1b, "d", 32, torch.float32, "cpu", cands, lambda c: None)
        assert tuner_invocations() == before + 2
    finally:
        del os.environ["SPARSEGNN_TUNE"]
    files = list(fresh_store.glob("*.sqlite"))
    with sqlite3.connect(files[0]) as conn:
        assert len(files) == 1 and conn.execute("SELECT COUNT(*) FROM decisions").fetchone()[0] == 2


def test_class_mates_are_timed_on_themselves_up_to_the_cap(fresh_store, monkeypatch):
    """Graphs of one structural class can prefer different configs: each of the first
    ``GRAPHS_PER_CLASS`` graphs gets its own timed decision (kept across Graph objects); later
    class-mates take the class's decision untimed."""
    monkeypatch.setenv("SPARSEGNN_TUNE", "exhaustive")
    monkeypatch.setattr(autotune, "GRAPHS_PER_CLASS", 3)
    graphs = [_graph(seed=s) for s in range(1, 6)]
    assert len({signature(graph_stats_cached(g)) for g in graphs}) == 1           # one class
    assert len({autotune.fingerprint(g) for g in graphs}) == 5                      # five graphs
    winner = {id(g): {"A": 1 + i % 2} for i, g in enumerate(graphs)}                # g0: A=1, g1: A=2, ...
    current = {}
    set_timer(lambda run, cfg: 0.5 if cfg == winner[current["g"]] else 1.0)
    cands = [{"A": 1}, {"A": 2}]

    def pick(g):
        current["g"] = id(g)
        return decide("toy", g, "d", 16, torch.float32, "cpu", cands, lambda c: None)

    before = tuner_invocations()
    assert pick(graphs[0]) == {"A": 1} and pick(graphs[1]) == {"A": 2} and pick(graphs[2]) == {"A": 1}
    assert tuner_invocations() == before + 3
    assert pick(graphs[1]) == {"A": 2} and tuner_invocations() == before + 3       # its own decision, kept
    # the class has been timed on 3 graphs: the 4th takes the class's decision (graph 0's) untimed
    assert pick(graphs[3]) == {"A": 1} and tuner_invocations() == before + 3
    record = lookup("toy", graphs[1], "d", 16, torch.float32, "cpu")
    assert record["config"] == {"A": 2} and record["ms"] == 0.5
    autotune._HOT.clear()             # as a later process: a graph timed on itself keeps its own decision
    assert pick(graphs[1]) == {"A": 2} and pick(graphs[4]) == {"A": 1} and tuner_invocations() == before + 3


def test_stored_config_outside_the_space_is_redecided(fresh_store):
    g = _graph()
    store = store_for_device("cpu")
    key = autotune.decision_key("spmm", g, "sum|val1|h0", 16, torch.float32)
    store.put(key, {"BLOCK_F": 48}, source="tuned")   # not in the space: from an older version
    cands = spmm_candidates(g.num_nodes, g.num_edges, 16, 4, 30)
    cfg = decide("spmm", g, "sum|val1|h0", 16, torch.float32, "cpu", cands, lambda c: None, space=SPMM_SPACE)
    assert cfg in cands


SECOND_PROCESS = textwrap.dedent("""
    import json, os, sys, torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    import sparsegnn as sg
    from sparsegnn import Graph
    from sparsegnn.tune import set_timer, tuner_invocations, candidates_timed
    calls = []
    set_timer(lambda run, cfg: calls.append(cfg) or (0.5 if cfg.get("SPLIT") else 1.0))
    ei, w = sg.datasets.random_graph(60, 400, seed=5, weighted=True)
    ei = torch.cat([ei, torch.stack([torch.arange(60), torch.full((60,), 3)])], 1)
    g = Graph.from_edge_index(ei, torch.cat([w, torch.ones(60)]), num_nodes=60).to(device)
    out = sg.spmm(g, torch.randn(60, 8, device=device), backend="triton")
    print(json.dumps({"decisions": tuner_invocations(), "timed": candidates_timed()}))
""")


@pytest.mark.slow
def test_second_process_reuses_persisted_decisions(tmp_path):
    """A fake timer stands in for GPU timing: the first process times candidates and persists
    the decision; a second process with the same cache times nothing.  (Kernels run on CUDA
    when there is a GPU: Triton 3.6's interpreter cannot run them with numpy 2.)"""
    env = dict(os.environ, SPARSEGNN_TUNE_CACHE=str(tmp_path), SPARSEGNN_TUNE="exhaustive")
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", SECOND_PROCESS], env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert runs[0]["decisions"] == 1 and runs[0]["timed"] > 1
    assert runs[1] == {"decisions": 0, "timed": 0}
    with sqlite3.connect(next(tmp_path.glob("*.sqlite"))) as conn:
        record = json.loads(conn.execute("SELECT record FROM decisions").fetchone()[0])
    assert record["config"].get("SPLIT") == 1 and record["source"] == "exhaustive"


def test_shipped_model_loads_and_predicts_fast():
    import time

    model = load_model()
    assert model is not None, "the cost model's weights must ship with the package"
    g = _graph()
    stats = graph_stats_cached(g)
    cands = spmm_candidates(g.num_nodes, g.num_edges, 64, 4, stats.deg_max)
    pred = model.predict(stats, 64, 4, cands)
    assert pred.shape == (len(cands),) and np.isfinite(pred).all()
    start = time.perf_counter()
    for _ in range(20):
        model.rank(stats, 64, 4, cands)
    assert (time.perf_counter() - start) / 20 < 5e-3   # < 1 ms on a quiet machine; CI is shared


def test_a_gpu_with_its_own_weights_gets_them_and_others_the_default(tmp_path, monkeypatch):
    """``load_model(device)`` reads ``cost_model_spmm.<device-slug>.json`` where the package
    ships one and the default weights for any other GPU (and for None)."""
    from sparsegnn.tune import model as model_mod

    default = load_model().to_json()
    own = dict(default, layers=[dict(layer) for layer in default["layers"]])
    own["layers"][-1] = dict(own["layers"][-1], b=[b + 1.0 for b in own["layers"][-1]["b"]])
    (tmp_path / model_mod.MODEL_FILE).write_text(json.dumps(default))
    (tmp_path / "cost_model_spmm.acme-gpu-9000-80gb.json").write_text(json.dumps(own))
    monkeypatch.setattr(model_mod, "DATA_DIR", tmp_path)
    model_mod.load_model.cache_clear()
    model_mod._load_file.cache_clear()
    try:
        assert model_mod.model_file("ACME GPU 9000 (80GB)") == "cost_model_spmm.acme-gpu-9000-80gb.json"
        assert model_mod.model_file("ACME GPU 8000") == model_mod.MODEL_FILE == model_mod.model_file(None)
        stats = graph_stats_cached(_graph())
        cands = spmm_candidates(200, 1500, 64, 4, stats.deg_max)
        base = model_mod.load_model("ACME GPU 8000").predict(stats, 64, 4, cands)
        assert np.allclose(model_mod.load_model("ACME GPU 9000 (80GB)").predict(stats, 64, 4, cands), base + 1.0)
        assert np.allclose(model_mod.load_model().predict(stats, 64, 4, cands), base)
    finally:
        model_mod.load_model.cache_clear()
        model_mod._load_file.cache_clear()


def test_the_tuner_ranks_with_the_weights_of_the_device_it_decides_for(fresh_store, monkeypatch):
    """``decide`` asks ``load_model`` for the decision's device (the store's name for it)."""
    asked = []
    monkeypatch.setattr(autotune, "load_model", lambda device=None: asked.append(device))
    monkeypatch.setenv("SPARSEGNN_TUNE", "model")
    g = _graph(seed=3)
    decide("spmm", g, "t", 64, torch.float32, "cpu", [{"A": 1}, {"A": 2}], lambda cfg: None)
    assert asked == ["cpu"]


class _Picks:
    """A cost model that ranks the candidates in a fixed order."""

    def __init__(self, order):
        self.order = order

    def rank(self, stats, num_feats, elem, candidates):
        return list(self.order)


def test_a_model_pick_is_redecided_under_other_weights_and_a_timed_one_is_kept(fresh_store, monkeypatch):
    """A stored pick of the cost model (source ``model``) holds for the weights that made it
    (records without ``weights`` are the default's): on a device whose weights differ it is
    decided again; a timed pick is kept whatever the weights."""
    from sparsegnn.tune.model import MODEL_FILE
    from sparsegnn.tune.store import reset_stores

    weights = {"file": "cost_model_spmm.acme.json"}
    monkeypatch.setattr(autotune, "model_file", lambda device=None: weights["file"])
    monkeypatch.setattr(autotune, "load_model", lambda device=None: _Picks([1, 0] if weights["file"] == "a" else [0, 1]))
    monkeypatch.setenv("SPARSEGNN_TUNE", "model")
    g, cands = _graph(seed=5), [{"A": 1}, {"A": 2}]
    args = ("spmm", g, "w", 64, torch.float32, "cpu", cands, lambda cfg: None)

    weights["file"] = "a"
    before = tuner_invocations()
    assert decide(*args) == {"A": 2}
    assert lookup("spmm", g, "w", 64, torch.float32, "cpu")["weights"] == "a"
    reset_stores()                                    # a new process: the record is on disk
    assert decide(*args) == {"A": 2} and tuner_invocations() == before + 1   # same weights: kept
    weights["file"] = "b"
    reset_stores()
    assert decide(*args) == {"A": 1} and tuner_invocations() == before + 2   # other weights: decided again
    assert lookup("spmm", g, "w", 64, torch.float32, "cpu")["weights"] == "b"

    # a record from before weights were recorded counts as the default's
    store = store_for_device("cpu")
    key = autotune.decision_key("spmm", g, "w", 64, torch.float32)
    record = dict(store.get_record(key))
    assert record.pop("weights") == "b" and store.get_record(key + "#" + autotune.fingerprint(g)) is None
    store.put(key, record.pop("config"), **{k: v for k, v in record.items() if k != "time"})
    weights["file"] = MODEL_FILE
    reset_stores()
    assert decide(*args) == {"A": 1} and tuner_invocations() == before + 2   # the default's: kept

    # a timed pick does not depend on the weights
    monkeypatch.setenv("SPARSEGNN_TUNE", "exhaustive")
    set_timer(lambda run, cfg: 1.0 if cfg["A"] == 2 else 3.0)
    g2 = _graph(seed=6)
    args2 = ("spmm", g2, "w", 64, torch.float32, "cpu", cands, lambda cfg: None)
    assert decide(*args2) == {"A": 2}
    weights["file"] = "c"
    reset_stores()
    n = tuner_invocations()
    assert decide(*args2) == {"A": 2} and tuner_invocations() == n


def test_weights_refitted_under_the_same_name_make_their_picks_again(fresh_store, monkeypatch, tmp_path):
    """A stored model pick records its weights file tagged with a digest of its bytes: new
    weights under the same file name (a refit) decide again, the same bytes keep the pick."""
    from sparsegnn.tune import model as model_mod
    from sparsegnn.tune.store import reset_stores

    data = tmp_path / "weights"
    data.mkdir()
    name = "cost_model_spmm.acme.json"
    monkeypatch.setattr(model_mod, "DATA_DIR", data)
    monkeypatch.setattr(autotune, "model_file", lambda device=None: name)
    order = {"now": [1, 0]}
    monkeypatch.setattr(autotune, "load_model", lambda device=None: _Picks(order["now"]))
    monkeypatch.setenv("SPARSEGNN_TUNE", "model")
    args = ("spmm", _graph(seed=7), "w", 64, torch.float32, "cpu", [{"A": 1}, {"A": 2}], lambda cfg: None)
    (data / name).write_text('{"fit": 1}')
    model_mod._weights_digest.cache_clear()
    try:
        before = tuner_invocations()
        assert decide(*args) == {"A": 2}
        first = lookup(*args[:6])["weights"]
        assert first.startswith(name + "#")
        reset_stores()
        assert decide(*args) == {"A": 2} and tuner_invocations() == before + 1     # same bytes: kept
        (data / name).write_text('{"fit": 2}')
        model_mod._weights_digest.cache_clear()
        order["now"] = [0, 1]
        reset_stores()
        assert decide(*args) == {"A": 1} and tuner_invocations() == before + 2     # refitted: decided again
        assert lookup(*args[:6])["weights"] not in (first, name)
        # a record of an earlier version names the file bare: decided again once, then kept
        store = store_for_device("cpu")
        key = autotune.decision_key(*args[:5])
        record = dict(store.get_record(key))
        store.put(key, record.pop("config"), **dict({k: v for k, v in record.items() if k != "time"}, weights=name))
        order["now"] = [1, 0]
        reset_stores()
        assert decide(*args) == {"A": 2} and tuner_invocations() == before + 3
        reset_stores()
        assert decide(*args) == {"A": 2} and tuner_invocations() == before + 3
    finally:
        model_mod._weights_digest.cache_clear()


def test_a_class_mates_own_model_pick_is_decided_again_once_under_other_weights(fresh_store, monkeypatch):
    """A class-mate with a model pick of its own, met first under new weights, is decided again
    once: its own record is renewed with the class's, not left stale for every later process."""
    from sparsegnn.tune.store import reset_stores

    weights = {"file": "a"}
    monkeypatch.setattr(autotune, "model_file", lambda device=None: weights["file"])
    monkeypatch.setattr(autotune, "load_model", lambda device=None: _Picks([1, 0] if weights["file"] == "a" else [0, 1]))
    monkeypatch.setenv("SPARSEGNN_TUNE", "model")
    g0, g1 = _graph(seed=1), _graph(seed=2)
    assert signature(graph_stats_cached(g0)) == signature(graph_stats_cached(g1))
    assert autotune.fingerprint(g0) != autotune.fingerprint(g1)
    cands = [{"A": 1}, {"A": 2}]
    pick = lambda g: decide("toy", g, "m", 16, torch.float32, "cpu", cands, lambda c: None)  # noqa: E731
    before = tuner_invocations()
    assert pick(g0) == {"A": 2} and pick(g1) == {"A": 2} and tuner_invocations() == before + 2
    assert lookup("toy", g1, "m", 16, torch.float32, "cpu")["weights"] == "a"     # g1's own record
    weights["file"] = "b"
    reset_stores()
    assert pick(g1) == {"A": 1} and tuner_invocations() == before + 3             # decided again
    counts = []
    for _ in range(3):                                                              # later processes
        reset_stores()
        n = tuner_invocations()
        assert pick(g1) == {"A": 1} and tuner_invocations() == n                    # g1: never again
        assert pick(g0) == {"A": 1}    # g0 joins the renewed class (decided on itself once)
        counts.append(tuner_invocations())
    assert counts[0] <= before + 4 and counts[1] == counts[2] == counts[0]          # then nothing more


def test_the_class_owner_decided_again_keeps_the_class_count(fresh_store, monkeypatch):
    """The graph a class record was decided on, decided again (its pick made by other weights),
    keeps the count of graphs the class was decided on: its mates' own decisions still count."""
    from sparsegnn.tune.store import reset_stores

    weights = {"file": "a"}
    monkeypatch.setattr(autotune, "model_file", lambda device=None: weights["file"])
    monkeypatch.setattr(autotune, "load_model", lambda device=None: _Picks([1, 0] if weights["file"] == "a" else [0, 1]))
    monkeypatch.setenv("SPARSEGNN_TUNE", "model")
    g0, g1 = _graph(seed=1), _graph(seed=2)
    pick = lambda g: decide("toy", g, "o", 16, torch.float32, "cpu", [{"A": 1}, {"A": 2}], lambda c: None)  # noqa: E731
    key = autotune.decision_key("toy", g0, "o", 16, torch.float32)
    assert pick(g0) == {"A": 2} and pick(g1) == {"A": 2}
    assert store_for_device("cpu").get_record(key)["graphs"] == 2
    weights["file"] = "b"
    reset_stores()
    before = tuner_invocations()
    assert pick(g0) == {"A": 1} and tuner_invocations() == before + 1
    record = store_for_device("cpu").get_record(key)
    assert record["fp"].endswith(autotune.fingerprint(g0)) and record["graphs"] == 2 and record["weights"] == "b"


def test_cost_model_forward_is_the_documented_mlp():
    rng = np.random.default_rng(0)
    d = build_inputs(GraphStats(100, 1000, 10.0, 3.0, 40, 9.0, 15.0, 30.0, 0.0, 0.0, 0.1, 0.2), 32, 4,
                     [{"BLOCK_F": 32, "BLOCK_E": 4, "num_warps": 1, "FLAT": 1}]).shape[1]
    spec = {"mean": rng.normal(size=d).tolist(), "std": (rng.random(d) + 0.5).tolist(),
            "layers": [{"W": rng.normal(size=(8, d)).tolist(), "b": rng.normal(size=8).tolist()},
                       {"W": rng.normal(size=(1, 8)).tolist(), "b": [0.3]}]}
    model = CostModel(spec)
    x = rng.normal(size=(5, d))
    h = np.maximum(((x - spec["mean"]) / np.array(spec["std"])) @ np.array(spec["layers"][0]["W"]).T + spec["layers"][0]["b"], 0)
    expect = h @ np.array(spec["layers"][1]["W"]).T[:, 0] + 0.3
    assert np.allclose(model.predict_matrix(x), expect)
    with pytest.raises(ValueError, match="CostModel"):
        CostModel(dict(spec, mean=spec["mean"][:-1], std=spec["std"][:-1]))


def _shipped_weights():
    """Every weights file the package ships: the default and each GPU's own."""
    from sparsegnn.tune.model import DATA_DIR, MODEL_FILE

    files = sorted(p.name for p in DATA_DIR.glob("cost_model_spmm*.json"))
    assert MODEL_FILE in files
    return files


@pytest.mark.parametrize("name", _shipped_weights())
def test_shipped_model_matches_the_inputs_it_is_given(name):
    from sparsegnn.tune.model import INPUT_NAMES, INPUTS_VERSION, _load_file

    spec = _load_file(name).to_json()
    assert spec["inputs_version"] == INPUTS_VERSION and spec["input_names"] == list(INPUT_NAMES)
    assert len(spec["mean"]) == len(INPUT_NAMES)
    with pytest.raises(ValueError, match="CostModel"):
        CostModel(dict(spec, inputs_version=INPUTS_VERSION + 1))


def test_the_h200_gets_the_weights_fitted_on_it():
    from sparsegnn.tune.model import model_file

    assert model_file("NVIDIA H200") == "cost_model_spmm.nvidia-h200.json" in _shipped_weights()
    assert load_model("NVIDIA H200") is not load_model("NVIDIA H100 80GB HBM3")


def _data_files(info):
    """(path, sha256) of each sweep file a shipped model records (``data`` and its ``extra``)."""
    out = []
    for part in (info, info.get("extra")):
        if part:
            paths = part["path"] if isinstance(part["path"], list) else [part["path"]]
            shas = part["sha256"] if isinstance(part["sha256"], list) else [part["sha256"]]
            out += list(zip(paths, shas))
    return out


@pytest.mark.parametrize("name", _shipped_weights())
def test_the_shipped_model_names_committed_training_data(name):
    """The weights name sweep files of this repository whose content (a gzipped file's
    decompressed bytes, as ``scripts/fit_cost_model.data_info`` hashes it) has the recorded
    sha256."""
    import gzip
    import hashlib
    from pathlib import Path

    from sparsegnn.tune.model import _load_file

    root = Path(__file__).resolve().parents[2]
    from sparsegnn.tune.model import MODEL_FILE

    data = _data_files(_load_file(name).to_json()["data"])
    assert len(data) == (2 if name == MODEL_FILE else 5)   # the H100 sweep and its extra; the H200's five sweeps
    for path, sha in data:
        raw = (root / path).read_bytes()
        assert hashlib.sha256(gzip.decompress(raw) if path.endswith(".gz") else raw).hexdigest() == sha, path


def test_cost_model_relative_inputs_are_relative_to_the_candidate_list():
    from sparsegnn.tune.model import CONFIG_NAMES, GRAPH_NAMES, INPUT_NAMES, OCCUPANCY_NAMES

    g, k = len(GRAPH_NAMES), len(GRAPH_NAMES) + len(CONFIG_NAMES) + len(OCCUPANCY_NAMES)
    assert len(INPUT_NAMES) == k + len(CONFIG_NAMES) + len(OCCUPANCY_NAMES)
    assert INPUT_NAMES[k:] == tuple("rel_" + name for name in INPUT_NAMES[g:k])
    stats = GraphStats(1000, 60000, 60.0, 400.0, 9000, 3.0, 20.0, 900.0, 0.6, 0.8, 0.0, 0.02)
    cands = spmm_candidates(1000, 60000, 64, 4, 9000)
    full, part = build_inputs(stats, 64, 4, cands), build_inputs(stats, 64, 4, cands[:3])
    assert np.array_equal(full[:3, :k], part[:, :k])                    # a config's own inputs: list-free
    assert np.allclose(full[:, k:], full[:, g:k] - full[:, g:k].mean(0))  # rel_: minus the list's mean
    assert np.allclose(part[:, k:], part[:, g:k] - part[:, g:k].mean(0))
    assert not np.allclose(full[:3, k:], part[:, k:])                  # so a row depends on the list
    assert np.array_equal(build_inputs(stats, 64, 4, cands[:1])[0, k:], np.zeros(len(INPUT_NAMES) - k))


def test_occupancy_inputs_follow_the_launch_geometry():
    from sparsegnn.tune.model import L2_BYTES, NUM_SMS, occupancy_inputs

    lg = lambda v: np.log2(v + 1.0)  # noqa: E731
    # 4 warps: 16 programs per SM (64 warps), 2112 on the GPU; 10000 launched, 2112 run at once
    got = occupancy_inputs(100_000, 64, 4, 32, 4, 10_000.0, 256.0)
    assert np.allclose(got, [lg(10_000 / (NUM_SMS * 16)), lg(NUM_SMS * 16 * 256 * 4), lg(100_000 * 128 / L2_BYTES),
                             lg(128), lg(NUM_SMS * 16)])
    # 1 warp: the 32-programs-per-SM limit; fewer launched than fit: all of them run; BLOCK_F > F
    got = occupancy_inputs(1000, 16, 2, 64, 1, 500.0, 64.0)
    assert np.allclose(got, [lg(500 / (NUM_SMS * 32)), lg(500 * 64 * 2), lg(1000 * 32 / L2_BYTES), lg(32), lg(500)])


def test_cost_model_inputs_are_finite_on_edge_cases():
    empty = GraphStats(50, 0, 0.0, 0.0, 0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0)
    single = GraphStats(1, 1, 1.0, 0.0, 1, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0)
    hub = GraphStats(1000, 60000, 60.0, 400.0, 9000, 3.0, 20.0, 900.0, 0.6, 0.8, 0.0, 0.02)
    for stats in (empty, single, hub):
        for f, elem in ((1, 4), (64, 2), (300, 4)):
            cands = spmm_candidates(stats.num_nodes, stats.num_edges, f, elem, stats.deg_max)
            x = build_inputs(stats, f, elem, cands)
            assert x.shape[0] == len(cands) and np.isfinite(x).all()
            assert np.isfinite(load_model().predict(stats, f, elem, cands)).all()
    assert build_inputs(hub, 64, 4, []).shape[0] == 0
    assert np.isfinite(build_inputs(hub, 0, 4, spmm_candidates(1000, 60000, 16, 4, 9000))).all()


def test_degree_profile_estimates_shares_of_a_real_distribution():
    from sparsegnn.tune.model import DegreeProfile

    rng = np.random.default_rng(0)
    for exponent in (1.8, 2.5):                       # heavy-tailed in-degrees (Zipf), up to 5000
        deg = np.minimum(rng.zipf(exponent, size=20000), 5000)
        rowptr = torch.tensor(np.concatenate([[0], np.cumsum(deg)]))
        col = torch.tensor(rng.integers(0, deg.size, size=int(deg.sum())))
        row = torch.repeat_interleave(torch.arange(deg.size), torch.tensor(deg))
        stats = graph_stats(rowptr, col, row)
        profile = DegreeProfile(stats)
        rows = [profile.rows_above(t) for t in (0, 2, 8, 64, 256, 4000, 6000)]
        assert all(a >= b for a, b in zip(rows, rows[1:])) and rows[-1] == 0.0
        for t in (8, 64, 128):
            assert profile.edges_above(t) == pytest.approx(deg[deg > t].sum() / deg.sum(), abs=0.1)
            assert profile.rows_above(t) == pytest.approx((deg > t).mean(), abs=0.02)
        assert profile.edges_above(256) == pytest.approx(stats.hub_share)   # pinned to the exact share


@pytest.mark.parametrize("n, e, f", [(2708, 10858, 32), (50515, 1638396, 256), (2449029, 123718280, 64)])
def test_spmm_candidates_are_valid(n, e, f):
    for max_degree in (None, 40, 5000):
        cands = spmm_candidates(n, e, f, 4, max_degree)
        assert len(cands) == len({tuple(sorted(c.items())) for c in cands})  # no duplicates
        assert all(in_space(c, SPMM_SPACE) for c in cands)
    assert all(in_space(c, SDDMM_SPACE) for c in sddmm_candidates(n, e, f, "dot"))
    assert not in_space({"BLOCK_F": 48}, SPMM_SPACE)


def test_flat_candidates_only_when_the_largest_row_is_short():
    from sparsegnn.kernels.configs import FLAT_MAX_STEPS

    def flat_steps(max_degree):
        cands = spmm_candidates(50_000, 1_600_000, 128, 4, max_degree)
        return [-(-max_degree // c.get("HEAVY_E", c["BLOCK_E"])) for c in cands if c.get("FLAT")]

    assert flat_steps(300) and max(flat_steps(300)) <= FLAT_MAX_STEPS
    assert flat_steps(100_000) == []
    assert any(c.get("SPLIT") for c in spmm_candidates(50_000, 1_600_000, 128, 4, 100_000))  # hubs: split
    assert not any(c.get("FLAT") for c in spmm_candidates(50_000, 1_600_000, 128, 4))  # degree unknown


@pytest.mark.skipif(not torch.cuda.is_available(), reason="timing candidates needs CUDA events")
def test_decide_times_on_gpu(fresh_store):
    g = _graph().to("cuda")
    slow = lambda cfg: torch.cuda._sleep(2_000_000 if cfg["A"] == 1 else 10)  # noqa: E731
    os.environ["SPARSEGNN_TUNE"] = "exhaustive"
    try:
        assert decide("toy", g, "d", 8, torch.float32, "cuda", [{"A": 1}, {"A": 2}], slow) == {"A": 2}
    finally:
        del os.environ["SPARSEGNN_TUNE"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="timing candidates needs CUDA events")
def test_candidates_are_timed_as_replays_without_host_gaps():
    """A two-launch schedule whose host pauses between its launches is timed by its GPU work
    (a CUDA-graph replay), not the host's gap, which ``measure(host=True)`` reports apart; a
    call that cannot be captured (it syncs) makes every candidate timed eagerly, so the two
    never mix."""
    import time as _time

    from sparsegnn.tune.autotune import _time_candidates, measure

    x = torch.ones(1 << 16, device="cuda")

    def gapped(cfg):
        x.mul_(1.0)
        _time.sleep(0.005)                      # 5 ms of host between the launches
        x.add_(0.0)

    def gpu_bound(cfg):
        torch.cuda._sleep(1_000_000)            # ~0.5 ms on the GPU, one launch

    run = lambda cfg: gapped(cfg) if cfg["A"] == 1 else gpu_bound(cfg)  # noqa: E731
    ms = _time_candidates(run, [{"A": 1}, {"A": 2}])
    assert ms[0] < 0.2 < ms[1] < 5.0            # replayed: the gap is not charged; the sleep is
    (gpu1, host1), (gpu2, host2) = measure(run, [{"A": 1}, {"A": 2}], host=True)
    assert gpu1 < 0.2 < gpu2 < 5.0
    assert 5.0 <= host1 < 50 and host2 < 1.0    # issuing: the gap is host time; the GPU's sleep is not
    assert [h for _, h in measure(run, [{"A": 1}])] == [0.0]    # host time only when asked

    def syncing(cfg):
        gapped(cfg)
        if cfg["A"] == 2:
            x.sum().item()                      # not capturable
    ms = _time_candidates(syncing, [{"A": 1}, {"A": 2}])
    assert min(ms) > 4.0                        # both eager: each carries the host's 5 ms gap


def test_warm_reaches_the_timing_and_defaults_to_cold(monkeypatch):
    """``decide(warm=...)`` reaches ``measure`` through ``_time_pairs`` (no GPU needed: both
    replaced by recorders); a decision that does not ask is timed cold."""
    asked = []
    monkeypatch.setattr(autotune, "measure", lambda run, configs, device=None, protocol=None, host=False,
                        warm=False: asked.append(warm) or [(1.0, 0.0)] * len(configs))
    autotune._time_pairs(lambda cfg: None, [{"A": 1}], "cuda", {}, True, True)
    autotune._time_pairs(lambda cfg: None, [{"A": 1}], "cuda", {}, True)
    assert asked == [True, False]
    seen = []
    real = autotune._time_pairs
    monkeypatch.setattr(autotune, "_time_pairs", lambda run, configs, device=None, protocol=None, host=False,
                        warm=False: seen.append(warm) or real(run, configs, device, protocol, host, warm))
    set_timer(lambda run, cfg: float(cfg["A"]))
    try:
        g = Graph.from_edge_index(torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3)
        for warm in (True, False):
            decide("warm_test", g, f"w{warm}", 8, torch.float32, torch.device("cpu"), [{"A": 2}, {"A": 1}],
                   lambda cfg: None, ranked=False, warm=warm)
        decide("warm_test", g, "default", 8, torch.float32, torch.device("cpu"), [{"A": 2}, {"A": 1}],
               lambda cfg: None, ranked=False)
    finally:
        set_timer(None)
    assert seen == [True, False, False]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="timing candidates needs CUDA events")
def test_warm_timing_keeps_what_the_call_before_left_in_l2(monkeypatch):
    """``measure(warm=True)`` times each call after the one before it, behind a spin kernel
    (no flush): a copy whose source and result fit in L2 together runs faster warm than after
    a flush; the spin runs for warm timings only."""
    from sparsegnn.tune import autotune

    spins = []
    sleep = torch.cuda._sleep
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: spins.append(cycles) or sleep(cycles))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    src = torch.randn(l2 // 16, device="cuda")                # a quarter of L2 in bytes, the result too
    out = torch.empty_like(src)
    run = lambda cfg: out.copy_(src)  # noqa: E731
    ((cold, _),) = autotune.measure(run, [{"A": 1}])
    assert spins == []
    ((warm, _),) = autotune.measure(run, [{"A": 1}], warm=True)
    assert spins and set(spins) == {autotune.WARM_SPIN_CYCLES}
    assert warm < 0.8 * cold


@pytest.mark.skipif(not torch.cuda.is_available(), reason="timing candidates needs CUDA events")
def test_a_capture_failing_on_the_second_timing_keeps_the_first(monkeypatch):
    """The three fastest are timed again; a capture that fails then (memory on a large graph)
    keeps the first timing rather than failing the decision."""
    from sparsegnn.tune import autotune

    real = autotune._captured
    calls = []

    def flaky(run, config):
        calls.append(config["A"])
        return real(run, config) if len(calls) <= 2 else None
    monkeypatch.setattr(autotune, "_captured", flaky)
    ms = autotune._time_candidates(lambda cfg: torch.cuda._sleep(100_000 * cfg["A"]), [{"A": 1}, {"A": 2}])
    assert len(ms) == 2 and 0 < ms[0] < ms[1] and len(calls) >= 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="timing candidates needs CUDA events")
def test_failed_captures_free_their_memory():
    """A candidate that cannot be captured (it syncs) leaves no pool behind: repeated failures
    with a 64 MB allocation inside do not grow the allocator's reserve, and a later capture
    and the eager timings still work."""
    from sparsegnn.tune import autotune

    def syncing(cfg):
        buf = torch.ones(16 << 20, device="cuda")         # 64 MB in the capture's pool
        buf.sum().item()                                    # not capturable
    for _ in range(2):
        assert autotune._captured(syncing, {}) is None
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()
    for _ in range(5):
        assert autotune._captured(syncing, {}) is None
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() <= reserved + (16 << 20)
    assert autotune._captured(lambda cfg: torch.ones(8, device="cuda").add_(1), {}) is not None
    assert len(autotune._time_candidates(syncing, [{"A": 1}, {"A": 2}])) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="timing candidates needs CUDA events")
def test_a_failed_capture_leaves_the_random_numbers_usable_and_unmoved():
    """A candidate that cannot be captured left torch's generator marked as capturing: the next
    dropout raised "Offset increment outside graph capture".  Now the generator works after it
    and continues the same stream of numbers (the failed capture drew none)."""
    from sparsegnn.tune import autotune

    def syncing(cfg):
        torch.ones(4, device="cuda").sum().item()         # not capturable

    torch.cuda.manual_seed(11)
    want = torch.rand(6, device="cuda")
    torch.cuda.manual_seed(11)
    assert autotune._captured(syncing, {}) is None
    assert torch.equal(torch.rand(6, device="cuda"), want)
    kept = torch.nn.functional.dropout(torch.ones(256, device="cuda"), 0.5)
    assert 0 < int((kept == 0).sum()) < 256


@pytest.mark.skipif(not torch.cuda.is_available(), reason="timing candidates needs CUDA events")
def test_the_timing_protocol_is_shared_by_the_calls_of_a_decision():
    """``decide`` times the model's pick, then the alternatives, with one ``protocol``: once a
    call could not be captured, it says eager, and later calls time eagerly without trying."""
    from sparsegnn.tune import autotune

    x = torch.ones(8, device="cuda")
    tried = []
    real = autotune._captured

    def counting(run, config):
        tried.append(config["A"])
        return real(run, config)

    def run(cfg):
        x.add_(1)
        if cfg["A"] == 2:
            x.sum().item()                                  # cannot be captured
    protocol = {}
    autotune._captured, saved = counting, autotune._captured
    try:
        autotune._time_candidates(run, [{"A": 1}], None, protocol)
        assert protocol == {"replayed": True}
        autotune._time_candidates(run, [{"A": 2}], None, protocol)
        assert protocol == {"replayed": False}
        before = len(tried)
        autotune._time_candidates(run, [{"A": 1}, {"A": 3}], None, protocol)
        assert protocol == {"replayed": False} and len(tried) == before    # eager, no capture tried
    finally:
        autotune._captured = saved


def test_families_that_time_the_row_kernel_carry_its_version():
    """A decision between the row kernel and something else (tiles, cuSPARSE, AGNN's fused
    kernel) compares the row kernel's speed: stored under an older row kernel it must be made
    again, so each such family's store name holds the row kernels' family (a tile
    config was once kept on real PROTEINS_full F=256 tf32 at 0.82x of the new row kernel)."""
    from sparsegnn.ops._triton import SPMM_FAMILY, VENDOR_FAMILY
    from sparsegnn.ops.attention import AGNN_TC_FAMILY
    from sparsegnn.ops.tiles import TC_FAMILY

    for family in (TC_FAMILY, VENDOR_FAMILY, AGNN_TC_FAMILY):
        assert family.endswith("+" + SPMM_FAMILY), family
    assert AGNN_TC_FAMILY.endswith("+" + TC_FAMILY)     # AGNN's path 1 sums through the TC decision
    assert len({TC_FAMILY, VENDOR_FAMILY, AGNN_TC_FAMILY, SPMM_FAMILY}) == 4


def test_the_fit_script_warns_of_a_bipartite_sweep_row_without_its_source_count(tmp_path):
    """A sweep recorded before ``num_src`` was: its bipartite graphs' inputs would read their
    rows as the gathered matrix's, so loading it says so; with ``num_src`` it loads quietly."""
    import warnings

    from scripts.fit_cost_model import load_cases

    stats = graph_stats_cached(_graph()).as_dict()
    stats.pop("num_src")
    row = {"graph": "bipartite/1/random", "group": "families", "family": "bipartite", "stats": stats, "F": 32,
           "dtype": "float32", "config": {"FLAT": 1, "BLOCK_E": 8, "BLOCK_F": 32, "num_warps": 1}, "ms": 0.1,
           "cusparse_ms": 0.2}
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    old.write_text(json.dumps(row) + "\n")
    new.write_text(json.dumps({**row, "stats": {**stats, "num_src": 3 * stats["num_nodes"]}}) + "\n")
    with pytest.warns(UserWarning, match="no num_src"):
        assert len(load_cases([str(old)])) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cases = load_cases([str(new)])
    assert len(cases) == 1


def test_sweep_builds_a_family_graph_under_any_group():
    """The sweep's ``bipartite-sizes`` group names family graphs (family/edges/order) at sizes
    between the ``families`` group's; they are built by the family generator, bipartite, and
    their rows carry the family (so leave-family-out folds hold them out with it)."""
    from scripts import sweep_tune

    names = sweep_tune.GROUPS["bipartite-sizes"]
    assert names and all(sweep_tune.family_of(name) == "bipartite" for name in names)
    assert not set(names) & set(sweep_tune.GROUPS["families"])
    graph, source = sweep_tune.load_graph("bipartite/10000/random", "bipartite-sizes", "cpu")
    assert source is None and graph.num_edges > 0 and graph.num_src == 3 * graph.num_nodes



def test_a_resumed_sweep_skips_what_it_timed_by_group_and_name(tmp_path):
    """``--skip-done`` skips a graph already in the file under the same group only: the paper
    group's ``cora`` is a stand-in, not the real graph the real group timed."""
    from scripts import sweep_tune

    out = tmp_path / "sweep.jsonl"
    work = [("cora", "real"), ("citeseer", "real"), ("cora", "paper")]
    assert sweep_tune.not_done(work, str(out)) == work                       # no file yet
    out.write_text(json.dumps({"graph": "cora", "group": "real", "ms": 1.0}) + "\n\n")
    assert sweep_tune.not_done(work, str(out)) == [("citeseer", "real"), ("cora", "paper")]


def test_fit_script_scores_weights_without_fitting(tmp_path, monkeypatch):
    """``fit_cost_model --score W``: W ranks every case; with all outputs equal (last layer
    zeroed) it picks each case's first candidate, so a case whose first config is 5x the best
    misses and the other passes."""
    from scripts import fit_cost_model as fcm

    spec = load_model().to_json()
    flat = dict(spec, layers=spec["layers"][:-1] + [{"W": [[0.0] * len(spec["layers"][-1]["W"][0])], "b": [0.0]}])
    weights = tmp_path / "flat.json"
    weights.write_text(json.dumps(flat))
    stats = GraphStats(100, 1000, 10.0, 3.0, 40, 9.0, 15.0, 30.0, 0.0, 0.0, 0.1, 0.2).as_dict()
    cfgs = [{"BLOCK_F": 32, "BLOCK_E": 4, "num_warps": 1, "FLAT": 1}, {"BLOCK_F": 64, "BLOCK_E": 4, "num_warps": 1, "FLAT": 1}]
    rows = [{"graph": g, "group": "real", "F": 32, "dtype": "float32", "config": c, "ms": ms, "rel_err": 0.0,
             "cusparse_ms": 1.0, "stats": stats}
            for g, times in (("fast_first", (1.0, 2.0)), ("slow_first", (5.0, 1.0))) for c, ms in zip(cfgs, times)]
    data = tmp_path / "sweep.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = tmp_path / "scores.md"
    monkeypatch.setattr(sys, "argv", ["fit", str(data), "--score", str(weights), "--report", str(report)])
    assert fcm.main() == 0
    line = next(l for l in report.read_text().splitlines() if l.startswith("| flat.json | all |"))
    assert "| 1/2 (50%) |" in line and "| 5.00 |" in line
