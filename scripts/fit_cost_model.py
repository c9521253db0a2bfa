"""Fit the SpMM cost model on the sweep data and evaluate it leave-graph-out.

The sweep files come from ``python -m scripts.sweep_tune`` on the GPU (the ones the shipped model was
fitted on: ``benchmarks/results/h100/tune_sweep_replay{,_extra}.jsonl.gz``, named in its weights).

    python -m scripts.fit_cost_model sweep.jsonl --extra sweep_extra.jsonl \
        --out src/sparsegnn/tune/data/cost_model_spmm.json --report notes/cost-model-eval.md
    python -m scripts.fit_cost_model sweep.jsonl --seed 5 \
        --out /tmp/cost_model_spmm.json --report /tmp/cost-model-eval.md
    python -m scripts.fit_cost_model families.jsonl --leave-family-out --shipped \
        --label "H200 families sweep" --report /tmp/families-eval.md

Weights for one GPU (``tune.model.model_file``: used on that GPU only) come from sweeps timed on
it, e.g. the H200's (``benchmarks/results/h200/cost_model.md`` gives the command).

Inputs per (case, config): ``tune.model.build_inputs`` (graph sizes, degree quantiles, what
the config implies on the graph: programs, serial steps, launches, occupancy, ..., and each
config input relative to the mean over the case's candidate list), built per case over exactly
the case's candidate list (the sweep times the list ``spmm_candidates`` gives, as the tuner
ranks it).  A case = graph x F x dtype.  Loss: listwise (ListNet): per case, the softmax of the
negated outputs is fitted to the softmax of ``-log2(ms / best) / tau``: the model is trained to order a case's configs, and
mostly to find its fastest ones, not to fit the slow tail's times (MSE on the per-case
centred log time, GPC's recipe and this script's first version, spent its capacity on configs
2-100x off the best, timing spikes included).  An ensemble of small MLPs (different seeds),
trained full-batch with Adam in torch on the CPU, is exported as one MLP (plain JSON: hidden
layers side by side, block diagonal, output = the members' mean x tau).

Per family (the sweep's ``families`` group; other graphs count under their group), the report
gives the share of zero-shot picks within 10%; ``--leave-family-out`` also predicts each
structure family's cases with a model trained without that family.

Leave-graph-out: every graph's cases are predicted by a model trained without that graph
(the exported form, through ``CostModel`` as at runtime).  Only the positional files' graphs
are evaluated; ``--extra`` files (``sweep_tune.py --groups extra``) only add training cases,
to every fold except that of the graph a copy was made from (rows with ``source``).  The
model fitted on everything is written to ``--out`` when given.  The report gives the zero-shot
pick's time over the case's best, the best of the top-3 shortlist, the heuristic (first
candidate), the failing cases, the measured prediction time, and how far the sweep's own
timings agree with the autotuner's re-measurements of the same configs (``--noise-from``).
"""
from __future__ import annotations

import argparse
import collections
import gzip
import hashlib
import json
import math
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from sparsegnn.datasets.families import FAMILIES, leave_out_folds
from sparsegnn.tune.features import GraphStats
from sparsegnn.tune.model import INPUT_NAMES, INPUTS_VERSION, CostModel, build_inputs, load_model

ELEM = {"float32": 4, "bfloat16": 2, "float16": 2}
SHORTLIST = 3
#: Benchmark files (same code as the sweep) whose rows record the autotuner's own timing
#: (``extra.tuned_ms``, kernel only, cold L2) of the config it picked: a second measurement.
NOISE_FILES = ("real_spmm_fp32.json", "real_spmm_bf16.json", "paper_spmm_fp32.json", "paper_bf16.json")


def _lines(path):
    """The lines of a sweep file, gunzipped where it is named ``.gz``."""
    with (gzip.open(path, "rt") if str(path).endswith(".gz") else open(path)) as f:
        yield from f


def load_cases(paths):
    """The cases (graph x F x dtype) of the sweep files ``paths`` (JSONL, gzipped where named
    ``.gz``); ``graph`` is ``(group, name)``,
    ``source`` the graph a copy was made from (the row's ``source``), else ``graph``; ``family``
    the row's structure family (the sweep's ``families`` group), else its group."""
    cases = collections.defaultdict(list)
    for path in paths:
        for line in _lines(path):
            r = json.loads(line)
            cases[(r["group"], r["graph"], r["F"], r["dtype"])].append(r)
    out = []
    for key, rows in cases.items():
        stats = GraphStats(**rows[0]["stats"])
        if rows[0].get("family") == "bipartite" and "num_src" not in rows[0]["stats"]:
            warnings.warn(f"bipartite graph {key[1]} has no num_src in its stats (a sweep made before "
                          f"it was recorded): its gathered-matrix inputs read its rows")
        # inputs over the case's whole candidate list (the sweep times exactly the list the
        # tuner ranks), as ``CostModel.rank`` builds them at run time: the ``rel_`` inputs are
        # relative to that list's mean; then rows without a valid timing are dropped
        x = build_inputs(stats, key[2], ELEM[key[3]], [r["config"] for r in rows])
        ok = np.array([math.isfinite(r["ms"]) and r.get("rel_err", 0) <= 1e-2 for r in rows])
        if not ok.any():
            continue
        rows = [r for r, keep in zip(rows, ok) if keep]
        out.append({"key": key, "graph": key[:2], "source": tuple(rows[0].get("source", key[:2])),
                    "family": rows[0].get("family") or key[0], "stats": stats,
                    "cfgs": [r["config"] for r in rows], "ms": np.array([r["ms"] for r in rows]), "x": x[ok],
                    "cusparse": rows[0]["cusparse_ms"]})
    return out


def _content_sha256(path) -> str:
    """sha256 of a sweep file's content (a ``.gz`` file's decompressed bytes)."""
    raw = Path(path).read_bytes()
    return hashlib.sha256(gzip.decompress(raw) if str(path).endswith(".gz") else raw).hexdigest()


def data_info(paths, cases):
    """The ``data`` record of the exported model: file(s) (one: as strings), hashes of their
    content, counts."""
    info = {"path": [str(p) for p in paths],
            "sha256": [_content_sha256(p) for p in paths],
            "cases": len(cases), "graphs": len({c["graph"] for c in cases})}
    if len(paths) == 1:
        info["path"], info["sha256"] = info["path"][0], info["sha256"][0]
    return info


def _pack(cases):
    width = max(len(c["ms"]) for c in cases)
    x = np.zeros((len(cases), width, cases[0]["x"].shape[1]))
    y = np.zeros((len(cases), width))
    mask = np.zeros((len(cases), width), dtype=bool)
    for i, c in enumerate(cases):
        n = len(c["ms"])
        x[i, :n], y[i, :n], mask[i, :n] = c["x"], np.log2(c["ms"] / c["ms"].min()), True
    return x, y, mask


def fit(cases, members=8, hidden=16, epochs=400, tau=0.1, lr=3e-3, weight_decay=1e-4, seed=0):
    """ListNet-trained ensemble of ``members`` MLPs (2 hidden layers of ``hidden``), as one CostModel."""
    x, y, mask = _pack(cases)
    rows = x[mask]
    mean, std = rows.mean(0), rows.std(0) + 1e-6
    xt = torch.tensor((x - mean) / std, dtype=torch.float32)
    mt = torch.tensor(mask)
    neg = torch.full(mt.shape, -1e9)
    target = torch.softmax(torch.where(mt, torch.tensor(-y / tau, dtype=torch.float32), neg), 1)
    nets, losses = [], []
    for k in range(members):
        torch.manual_seed(seed + k)
        net = torch.nn.Sequential(torch.nn.Linear(x.shape[2], hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                  torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
        opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
        for _ in range(epochs):
            opt.zero_grad()
            logp = torch.log_softmax(torch.where(mt, -net(xt).squeeze(-1), neg), 1)
            loss = -(target * torch.where(mt, logp, torch.zeros_like(logp))).sum(1).mean()
            loss.backward()
            opt.step()
            sched.step()
        nets.append([m for m in net if isinstance(m, torch.nn.Linear)])
        losses.append(float(loss.detach()))
    # one MLP: members side by side; the output averages them and rescales to log2 time
    weights = [[(m.weight.detach().double().numpy(), m.bias.detach().double().numpy()) for m in layers] for layers in nets]
    first = (np.concatenate([w[0][0] for w in weights]), np.concatenate([w[0][1] for w in weights]))
    middle = np.zeros((members * hidden, members * hidden))
    for k, w in enumerate(weights):
        middle[k * hidden:(k + 1) * hidden, k * hidden:(k + 1) * hidden] = w[1][0]
    second = (middle, np.concatenate([w[1][1] for w in weights]))
    last = (np.concatenate([w[2][0] for w in weights], axis=1) * tau / members,
            np.array([sum(float(w[2][1][0]) for w in weights) * tau / members]))
    spec = {"version": 2, "inputs_version": INPUTS_VERSION, "input_names": list(INPUT_NAMES),
            "target": "order of a case's configs; output ~ log2(ms / case best) + per-case constant",
            "loss": f"ListNet, tau={tau} (log2 units)", "members": members, "hidden": hidden, "epochs": epochs,
            "mean": [float(v) for v in mean], "std": [float(v) for v in std],
            "layers": [{"W": [[float(f"{v:.7g}") for v in row] for row in w], "b": [float(f"{v:.7g}") for v in b]}
                       for w, b in (first, second, last)],
            "train_cases": len(cases), "train_rows": int(mask.sum()), "train_loss": float(np.mean(losses))}
    return CostModel(spec)


def evaluate(model, cases):
    rows = []
    for c in cases:
        order = np.argsort(model.predict_matrix(c["x"]), kind="stable")
        best = c["ms"].min()
        rows.append({"key": c["key"], "pick": c["ms"][order[0]] / best, "top3": c["ms"][order[:SHORTLIST]].min() / best,
                     "first": c["ms"][0] / best, "n": len(c["ms"]), "pick_ms": c["ms"][order[0]], "best_ms": best,
                     "pick_cfg": c["cfgs"][order[0]], "best_cfg": c["cfgs"][int(np.argmin(c["ms"]))]})
    return rows


def _family(cfg):
    if cfg.get("FLAT"):
        return "hybrid flat" if cfg.get("HEAVY_E") else "flat"
    if cfg.get("SPLIT"):
        return "split" if cfg.get("INLINE", 1) else "split+combine"
    return "row groups" if cfg.get("LIGHT_STEPS") == 64 else "planned"


def _short(cfg):
    keys = ("BLOCK_E", "BLOCK_F", "num_warps", "GROUP_ROWS", "GROUP_E", "PIECE_STEPS")
    return _family(cfg) + " " + ",".join(f"{k.replace('num_warps', 'W').replace('BLOCK_', '').replace('GROUP_', 'G')}"
                                         f"={cfg[k]}" for k in keys if k in cfg)


def remeasured(data_paths, bench_dir):
    """(case key, config, sweep ms, autotuner ms) for every config re-timed in NOISE_FILES."""
    index = {}
    for path in data_paths:
        for line in _lines(path):
            r = json.loads(line)
            config = json.dumps(r["config"], sort_keys=True)
            index[(r["graph"], r["stats"]["num_edges"], r["F"], r["dtype"], config)] = (
                (r["group"], r["graph"], r["F"], r["dtype"]), r["ms"])
    pairs = {}
    for name in NOISE_FILES:
        path = Path(bench_dir) / name
        if not path.exists():
            continue
        for row in json.loads(path.read_text()).get("rows", []):
            extra = row.get("extra") or {}
            if row.get("op") != "spmm" or row.get("provider") != "sparsegnn" or extra.get("tuned_ms") is None:
                continue
            hit = index.get((row["graph"], row["nnz"], row["F"], row["dtype"], json.dumps(extra.get("config"), sort_keys=True)))
            if hit is not None:
                pairs[(hit[0], json.dumps(extra["config"], sort_keys=True))] = (hit[0], extra["config"], hit[1], extra["tuned_ms"])
    return list(pairs.values())


def per_family_lines(cases, held, family_held, shipped=None):
    """The report's per-family table: cases whose zero-shot pick is within 10% of the best, with
    the case's graph held out, (``family_held``) with its whole family held out, and
    (``shipped``: rows of the shipped model, nothing refitted) by the model the package ships."""
    family_of = {c["key"]: c["family"] for c in cases}
    by_family = collections.defaultdict(list)
    for r in held:
        by_family[family_of[r["key"]]].append(r)
    shipped_by = collections.defaultdict(list)
    for r in shipped or ():
        shipped_by[family_of[r["key"]]].append(r)
    share = lambda rows: (f" {sum(r['pick'] <= 1.1 for r in rows)} "  # noqa: E731
                          f"({100 * sum(r['pick'] <= 1.1 for r in rows) / len(rows):.0f}%) |" if rows else " |")
    head = "| family | cases | graph held out: pick within 10% |"
    lines = ["## Per family", "", head + (" family held out: pick within 10% |" if family_held else "")
             + (" shipped model: pick within 10% |" if shipped else ""),
             "|---|---|---|" + ("---|" if family_held else "") + ("---|" if shipped else "")]
    for family in sorted(by_family):
        line = f"| {family} | {len(by_family[family])} |" + share(by_family[family])
        if family_held:
            line += share(family_held.get(family))
        if shipped:
            line += share(shipped_by.get(family))
        lines.append(line)
    return lines + [""]


def noise_bound(cases, ratios, reps=300, seed=0):
    """Expected zero-shot score of an oracle that knows the noise-free times (taken to be the
    sweep's), when every timing is multiplied by a factor drawn from ``ratios``."""
    rng = np.random.default_rng(seed)
    logs = np.log(ratios)
    hits = []
    for _ in range(reps):
        n = 0
        for c in cases:
            noisy = c["ms"] * np.exp(rng.choice(logs, size=len(c["ms"])))
            n += noisy[int(np.argmin(c["ms"]))] <= 1.1 * noisy.min()
        hits.append(n)
    return float(np.mean(hits)), np.percentile(hits, [5, 95])


def _weights(name: str) -> CostModel:
    """The weights file ``name``: a path, else a file the package ships (``tune/data``)."""
    from sparsegnn.tune.model import _load_file

    path = Path(name)
    model = CostModel(json.loads(path.read_text())) if path.exists() else _load_file(name)
    if model is None:
        raise ValueError(f"fit_cost_model --score: no weights file {name!r}")
    return model


def score_report(paths, names, label: str) -> str:
    """Markdown: each weights file's zero-shot pick and top-3 shortlist on every case of the
    sweep files ``paths`` (nothing fitted, nothing held out), per group or family and dtype."""
    cases = load_cases(paths)
    geo = lambda v: math.exp(sum(math.log(x) for x in v) / len(v))  # noqa: E731
    lines = [f"# Cost-model weights scored on {label}", "",
             f"{len(cases)} cases (graph x F x dtype) on {len({c['graph'] for c in cases})} graphs; every weights "
             "file ranks every case's candidates, nothing is refitted or held out. Within 10%: the zero-shot pick "
             "takes at most 1.1x the case's best timing.", "",
             "| weights | group or family | dtype | zero-shot within 10% | zero-shot geomean / best | worst | top-3 geomean / best |",
             "|---|---|---|---|---|---|---|"]
    for name in names:
        rows = evaluate(_weights(name), cases)
        family_of = {c["key"]: c["family"] for c in cases}
        groups = collections.defaultdict(list)
        for r in rows:
            groups[(family_of[r["key"]], r["key"][3])].append(r)
            groups[("all", r["key"][3])].append(r)
        for (family, dtype), rs in sorted(groups.items()):
            ok = sum(r["pick"] <= 1.1 for r in rs)
            lines.append(f"| {Path(name).name} | {family} | {dtype} | {ok}/{len(rs)} ({100 * ok / len(rs):.0f}%) | "
                         f"{geo([r['pick'] for r in rs]):.3f} | {max(r['pick'] for r in rs):.2f} | "
                         f"{geo([r['top3'] for r in rs]):.3f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", nargs="+", help="sweep file(s) whose graphs are evaluated leave-graph-out")
    parser.add_argument("--extra", nargs="+", default=[], help="sweep file(s) for training only (never evaluated)")
    parser.add_argument("--out", help="write the model fitted on all cases here (plain JSON; default: not written)")
    parser.add_argument("--report", required=True)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=400)
    parser.add_argument("--tau", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0,
                        help="members use seeds seed, seed + 1, ... (0: the shipped model; +-4 cases between seeds)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--noise-from", default=None, help="benchmark folder with NOISE_FILES (default: the data's)")
    parser.add_argument("--leave-family-out", action="store_true",
                        help="also hold out each structure family whole (the sweep's families group)")
    parser.add_argument("--shipped", action="store_true",
                        help="also score the model the package ships on every case (nothing refitted)")
    parser.add_argument("--label", default="sweep data", help="what the report's title says the data is")
    parser.add_argument("--score", nargs="+", default=None, metavar="WEIGHTS",
                        help="fit nothing: score these weights files (names under tune/data, or paths) on the data")
    args = parser.parse_args()
    if args.score:
        Path(args.report).write_text(score_report(args.data + args.extra, args.score, args.label))
        print(Path(args.report).read_text())
        return 0
    torch.set_num_threads(args.threads)
    hyper = dict(members=args.members, hidden=args.hidden, epochs=args.epochs, tau=args.tau, seed=args.seed)
    t0 = time.perf_counter()
    cases = load_cases(args.data)
    extra = load_cases(args.extra) if args.extra else []
    graphs = sorted({c["graph"] for c in cases})
    clash = sorted({c["graph"] for c in extra} & set(graphs))
    if clash:
        parser.error(f"--extra repeats evaluated graphs: {', '.join(' '.join(g) for g in clash)}")
    held = []
    for g in graphs:
        train = [c for c in cases + extra if g not in (c["graph"], c["source"])]
        model = fit(train, **hyper)
        rows = evaluate(model, [c for c in cases if c["graph"] == g])
        held += rows
        print(f"held out {' '.join(g)}: {sum(r['pick'] <= 1.1 for r in rows)}/{len(rows)} "
              f"(trained on {len(train)} cases, {sum(c['source'] != g for c in extra)} extra)", flush=True)
    family_held = {}                   # family -> its cases' rows, predicted without the family
    if args.leave_family_out:
        for train_idx, out_idx in leave_out_folds([(c["family"], c["graph"]) for c in cases], by="family"):
            family = cases[out_idx[0]]["family"]
            if family not in FAMILIES:     # only the structure families are held out whole
                continue
            train = [cases[i] for i in train_idx] + [c for c in extra if c["family"] != family]
            rows = family_held[family] = evaluate(fit(train, **hyper), [cases[i] for i in out_idx])
            print(f"held out family {family}: {sum(r['pick'] <= 1.1 for r in rows)}/{len(rows)}", flush=True)
    final = fit(cases + extra, **hyper)
    final.spec["data"] = data_info(args.data, cases)
    if extra:
        final.spec["data"]["extra"] = data_info(args.extra, extra)
    exported = json.dumps(final.to_json(), separators=(",", ":")) + "\n"
    if args.out:
        Path(args.out).write_text(exported)
    fit_s = time.perf_counter() - t0

    # prediction time per case, as the autotuner calls it (features + MLP)
    shipped = CostModel(json.loads(exported))
    for c in cases[:20]:
        shipped.rank(c["stats"], c["key"][2], ELEM[c["key"][3]], c["cfgs"])
    per_case = []
    for c in cases:
        start = time.perf_counter()
        for _ in range(5):
            shipped.rank(c["stats"], c["key"][2], ELEM[c["key"][3]], c["cfgs"])
        per_case.append((time.perf_counter() - start) / 5 * 1e3)

    n = len(held)
    geo = lambda v: math.exp(sum(math.log(x) for x in v) / len(v))  # noqa: E731
    line = lambda label, key, count: (f"| {label} | {count}/{n} ({100 * count / n:.0f}%) | "  # noqa: E731
                                      f"{geo([r[key] for r in held]):.3f} | {max(r[key] for r in held):.2f} |")
    within = sum(r["pick"] <= 1.10 for r in held)
    within3 = sum(r["top3"] <= 1.10 for r in held)
    heur = sum(r["first"] <= 1.10 for r in held)
    within_us = sum(r["pick"] <= 1.10 or r["pick_ms"] - r["best_ms"] <= 0.002 for r in held)
    tiny = [r for r in held if r["best_ms"] < 0.02]
    big = [r for r in held if r["best_ms"] >= 0.02]
    lines = [f"# Cost model, leave-graph-out ({args.label})", "",
             f"{len(cases)} cases (graph x F x dtype) on {len(graphs)} graphs, {sum(len(c['ms']) for c in cases)} timed configs.",
             "Each graph's cases are predicted by a model trained on the other graphs only.",
             *([f"Training also uses {len(extra)} cases on {len({c['graph'] for c in extra})} extra graphs "
                f"({', '.join(map(str, args.extra))}), never evaluated; a fold leaves out the extra copies of its "
                "held-out graph."] if extra else []),
             f"Model: {args.members} MLPs (2 x {args.hidden} hidden, ReLU) trained with a listwise loss "
             f"(ListNet, tau = {args.tau} in log2 units) on `tune.model.build_inputs` ({len(INPUT_NAMES)} inputs, "
             f"version {INPUTS_VERSION}), {args.epochs} full-batch Adam epochs; exported as one MLP in plain JSON.", "",
             "| selection | within 10% of the case's best | geomean time / best | worst |", "|---|---|---|---|",
             line("zero-shot pick (model top-1, nothing timed)", "pick", within),
             line(f"shortlist (model top-{SHORTLIST}, timed)", "top3", within3),
             line("heuristic (first candidate)", "first", heur), "",
             f"Additional line, not the acceptance metric: zero-shot pick within 10% **or within 2 us** of the "
             f"case's best: {within_us}/{n} ({100 * within_us / n:.0f}%).",
             f"By kernel size: cases whose best takes < 20 us: {sum(r['pick'] <= 1.1 for r in tiny)}/{len(tiny)} "
             f"within 10%; >= 20 us: {sum(r['pick'] <= 1.1 for r in big)}/{len(big)}.", "",
             f"Shortlist tuning times {SHORTLIST} of {geo([r['n'] for r in held]):.1f} candidates (geomean): "
             f"{SHORTLIST / geo([r['n'] for r in held]):.2f} of exhaustive tuning's timings.", "",
             f"Prediction (`CostModel.rank`: inputs + MLP, numpy, this machine): mean {np.mean(per_case):.3f} ms per case, "
             f"max {np.max(per_case):.3f} ms ({geo([r['n'] for r in held]):.0f} candidates, geomean). "
             f"Fit + leave-graph-out: {fit_s:.0f} s on {args.threads} CPU thread(s).", ""]

    shipped_rows = None
    if args.shipped:
        model = load_model()
        if model is None:
            parser.error("--shipped: the package ships no cost model")
        shipped_rows = evaluate(model, cases)
        ok = sum(r["pick"] <= 1.1 for r in shipped_rows)
        lines += [f"The shipped model (`tune/data/cost_model_spmm.json`, fitted on other graphs), nothing refitted: "
                  f"zero-shot pick within 10% on {ok}/{len(shipped_rows)} ({100 * ok / len(shipped_rows):.0f}%), "
                  f"geomean time / best {geo([r['pick'] for r in shipped_rows]):.3f}, worst "
                  f"{max(r['pick'] for r in shipped_rows):.2f}.", ""]
    lines += per_family_lines(cases, held, family_held, shipped_rows)
    pairs = remeasured(args.data, args.noise_from or Path(args.data[0]).parent)
    if pairs:
        ratios = np.array([p[2] / p[3] for p in pairs])
        off = np.abs(np.log(ratios)) > math.log(1.1)
        mean_hits, (lo, hi) = noise_bound(cases, ratios)
        mean_up, (lo_up, hi_up) = noise_bound(cases, np.maximum(ratios, 1.0))
        picked = {(r["key"], json.dumps(r["pick_cfg"], sort_keys=True)): r for r in held}
        worst = max(pairs, key=lambda p: p[2] / p[3])
        lines += ["## How noisy are the labels", "",
                  f"{len(pairs)} configs of the sweep were timed again, with the same code and protocol (kernel only, "
                  f"cold L2), by the autotuner in {', '.join(NOISE_FILES)} (`extra.tuned_ms`). The two timings differ "
                  f"by more than 10% for {int(off.sum())} of them ({100 * off.mean():.0f}%): the sweep slower by > 10% "
                  f"{int((ratios > 1.1).sum())} times, faster by > 10% {int((ratios < 1 / 1.1).sum())} times "
                  f"(ratio quantiles 5/25/50/75/95%: "
                  f"{' / '.join(f'{q:.2f}' for q in np.quantile(ratios, [0.05, 0.25, 0.5, 0.75, 0.95]))}). "
                  "The disagreements are mostly one-sided, the sweep slower (consistent with a slow host or a "
                  "clock transient adding time; in some cases several consecutive configs are inflated), "
                  f"e.g. {' '.join(map(str, worst[0]))}, "
                  f"{_short(worst[1])}: {worst[2]:.4f} ms in the sweep, {worst[3]:.4f} ms by the tuner.", "",
                  f"An oracle that knows the noise-free times (taken to be the sweep's) would, with every timing "
                  f"multiplied by a factor drawn from these pairs, score {mean_hits:.0f}/{n} "
                  f"({100 * mean_hits / n:.0f}%, 5-95%: {lo:.0f}-{hi:.0f}) on this metric; with the spikes only (factors "
                  f"< 1 set to 1) {mean_up:.0f}/{n} ({100 * mean_up / n:.0f}%, {lo_up:.0f}-{hi_up:.0f}). "
                  + ("The 90% bar is above what these labels can confirm." if lo < 0.9 * n else
                     "Even at the 5% quantile that is above the 90% bar: these labels can confirm it."), ""]
        checked = [(p, picked[(p[0], json.dumps(p[1], sort_keys=True))]) for p in pairs
                   if (p[0], json.dumps(p[1], sort_keys=True)) in picked]
        fails = [(p, r) for p, r in checked if r["pick"] > 1.1]
        if fails:
            ok = sum(p[3] <= 1.1 * r["best_ms"] for p, r in fails)
            lines += [f"Failing zero-shot picks that were re-timed by the tuner ({ok} of {len(fails)} then take at most "
                      "1.1x the case's best sweep time, i.e. would pass on the re-timing):", "",
                      "| case | pick | sweep ms | tuner ms | case best (sweep) ms |", "|---|---|---|---|---|"]
            lines += [f"| {' '.join(map(str, r['key']))} | {_short(r['pick_cfg'])} | {p[2]:.4f} | {p[3]:.4f} | "
                      f"{r['best_ms']:.4f} |" for p, r in fails]
            lines.append("")

    lines += ["## Cases where the zero-shot pick is more than 10% off", "",
              "| case | pick / best | top-3 / best | best ms | pick | best |", "|---|---|---|---|---|---|"]
    lines += [f"| {' '.join(map(str, r['key']))} | {r['pick']:.2f} | {r['top3']:.2f} | {r['best_ms']:.4f} | "
              f"{_short(r['pick_cfg'])} | {_short(r['best_cfg'])} |" for r in held if r["pick"] > 1.10]
    Path(args.report).write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:20]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
