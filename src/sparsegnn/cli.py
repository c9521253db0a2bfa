"""Command line: ``sparsegnn train | bench | tune | info`` (also ``python -m sparsegnn``)."""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import sys
from typing import Iterator, List, Optional

import torch


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class _Parser(argparse.ArgumentParser):
    """``argparse`` with a one-line error: ``sparsegnn train: error: --hidden: ...`` on stderr and
    exit status 2 (argparse's own usage block buries the message under every option)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _int_at_least(low: int):
    """An argparse type: an integer >= ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value
    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _precisions(text: str) -> str:
    """An argparse type: comma-separated reduced precisions (``tf32``, ``bf16``)."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in ("tf32", "bf16")]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected tf32 and / or bf16, comma-separated, got {text!r}")
    return ",".join(names)


def _float_in(low: float, high: float = float("inf"), *, open_high: bool = False, open_low: bool = False):
    """An argparse type: a finite float in ``[low, high]`` (ends open as asked)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        bad = (not math.isfinite(value) or value < low or (open_low and value == low)
               or value > high or (open_high and value == high))
        if bad:
            span = f"{'(' if open_low else '['}{low:g}, {high:g}{')' if open_high or high == float('inf') else ']'}"
            raise argparse.ArgumentTypeError(f"expected a number in {span}, got {text!r}")
        return value
    return parse


def _usable_dir(option: str, value: Optional[str]) -> Optional[str]:
    """Why the input folder ``value`` of ``option`` cannot be read (None when it can, or is not given)."""
    if value is None:
        return None
    from pathlib import Path

    path = Path(value).expanduser()
    if not path.is_dir():
        return f"{option} {value}: no such directory"
    if not os.access(path, os.R_OK | os.X_OK):
        return f"{option} {value}: directory not readable"
    return None


def _writable_out(option: str, value: Optional[str], is_dir: bool = True) -> Optional[str]:
    """Why the output ``value`` of ``option`` (a folder, or a file when not ``is_dir``) cannot be
    written (None when it can).  Checked before any work, so a run's results are never lost to a
    bad path at its end: the folder is made (as the command would) and a probe file written
    and removed in it (permission bits alone say nothing for root, or on /proc)."""
    if value is None:
        return None
    import tempfile
    from pathlib import Path

    path = Path(value).expanduser()
    folder = path if is_dir else path.parent
    if not is_dir and path.is_dir():
        return f"{option} {value}: is a directory"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return f"{option} {value}: cannot write there ({exc.strerror or exc})"
    return None


def _path_problem(args: argparse.Namespace, outputs=(), out_files=()) -> Optional[str]:
    """The first unusable input folder (``--data-dir``, ``--root``) or output of ``args``."""
    for option, attr in (("--data-dir", "data_dir"), ("--root", "root")):
        problem = _usable_dir(option, getattr(args, attr, None))
        if problem:
            return problem
    for option, attr in outputs:
        problem = _writable_out(option, getattr(args, attr, None))
        if problem:
            return problem
    for option, attr in out_files:
        problem = _writable_out(option, getattr(args, attr, None), is_dir=False)
        if problem:
            return problem
    return None


def _fanouts(text: str) -> List[int]:
    try:
        fanouts = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        fanouts = []
    if not fanouts or any(f == 0 or f < -1 for f in fanouts):
        raise argparse.ArgumentTypeError(f"fanouts must be comma-separated positive ints or -1 (all), got {text!r}")
    return fanouts


def _dims(text: str) -> List[int]:
    try:
        dims = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        dims = []
    if not dims or any(d < 1 for d in dims):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive ints, got {text!r}")
    return dims


#: Why ``--maxk-linear-first`` / ``--linear-first`` is refused with ``--model sage``.
_LINEAR_FIRST_SAGE = ("--maxk-linear-first is for --model gcn / gin (MaxK after their linear map); SAGE's placement "
                      "is already the authors'")


def _maxk_problem(args: argparse.Namespace) -> Optional[str]:
    """Why ``train --maxk`` cannot run with the other options (None when it can)."""
    from .nn.models import MAXK_CONVS

    if args.model not in MAXK_CONVS:
        return f"--maxk needs --model {', '.join(MAXK_CONVS)} (MaxK-GNN's convs), got {args.model}"
    if args.minibatch is not None:
        return "--maxk trains on the full graph; drop --minibatch"
    if args.precision != "ieee":
        return "--maxk aggregates exactly; drop --precision"
    if args.maxk_linear_first and args.model == "sage":
        return _LINEAR_FIRST_SAGE
    hidden = 256 if args.hidden is None else args.hidden
    if not 1 <= args.maxk <= hidden:
        return f"--maxk must be in [1, hidden = {hidden}], got {args.maxk}"
    return None


#: Node-classification defaults of the ``train`` options whose graph-level defaults differ.
_NODE_DEFAULTS = {"epochs": 200, "lr": 0.01, "weight_decay": 5e-4, "compile": "none"}

#: ``--matmul-precision``: ``torch.set_float32_matmul_precision`` for the dense layers' fp32 GEMMs.
MATMUL_PRECISIONS = ("highest", "high")
_MATMUL_HELP = ("fp32 GEMMs of the dense layers: highest (exact fp32, default) or high (TF32 tensor cores, "
                "~1e-3 relative error a product; torch.set_float32_matmul_precision) for the whole run")


@contextlib.contextmanager
def _matmul_precision(precision: str) -> Iterator[None]:
    """``torch.set_float32_matmul_precision(precision)`` for the command; the previous setting after it."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def _cmd_train(args: argparse.Namespace) -> int:
    with _matmul_precision(args.matmul_precision):
        return _train(args)


def _train(args: argparse.Namespace) -> int:
    from .datasets import load
    from .graph_training import GRAPH_MODELS, is_graph_dataset
    from .training import train_minibatch, train_node_classifier

    problem = _path_problem(args)
    if problem is not None:
        print(f"train: {problem}", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("train: --device cuda requested but no CUDA device is available", file=sys.stderr)
        return 2
    if is_graph_dataset(args.dataset) or args.model in GRAPH_MODELS:
        return _cmd_train_graphs(args)
    for key, value in _NODE_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.split is not None or args.folds is not None:
        print("train: --split and --folds are for graph-level datasets (tox21, PROTEINS_full, ENZYMES)",
              file=sys.stderr)
        return 2
    if args.minibatch is None and args.batch_size is not None:
        print("train: --batch-size needs --minibatch (full-graph training has no batches)", file=sys.stderr)
        return 2
    if args.minibatch is not None and args.reorder is not None:
        print("train: --reorder applies to full-graph training; drop it with --minibatch", file=sys.stderr)
        return 2
    if args.minibatch is not None and args.precision != "ieee":
        print("train: --precision applies to full-graph training; drop it with --minibatch", file=sys.stderr)
        return 2
    if args.minibatch is not None and args.compile != "none":
        print("train: --minibatch trains eagerly; drop --compile", file=sys.stderr)
        return 2
    if args.nproc is not None:
        return _cmd_train_distributed(args)
    if args.maxk is not None or args.maxk_linear_first:
        problem = (_maxk_problem(args) if args.maxk is not None else
                   "--maxk-linear-first places MaxK in MaxK-GNN's model; pass --maxk K too")
        if problem is not None:
            print(f"train: {problem}", file=sys.stderr)
            return 2
    data = load(args.dataset, root=args.root, data_dir=args.data_dir)
    results = []
    progress = not args.json and sys.stderr.isatty() or args.progress
    for run in range(args.runs):
        common = dict(epochs=args.epochs, lr=args.lr, weight_decay=args.weight_decay, hidden=args.hidden,
                      dropout=args.dropout, seed=args.seed + run, device=args.device, backend=args.backend,
                      progress=progress)
        if args.minibatch is not None:
            result = train_minibatch(data, args.model, fanouts=args.minibatch, batch_size=args.batch_size or 1024,
                                     **common)
        else:
            result = train_node_classifier(data, args.model, compile=args.compile,
                                           compile_backend=args.compile_backend, reorder=args.reorder,
                                           precision=args.precision, maxk=args.maxk,
                                           maxk_linear_first=args.maxk_linear_first, **common)
        results.append(result)
        if not args.json:
            print(f"seed {result.seed}: val {100 * result.val_acc:.2f}%  test {100 * result.test_acc:.2f}%  "
                  f"(test at best val {100 * result.test_acc_at_best_val:.2f}%)  "
                  f"epoch {result.mean_epoch_ms:.2f} ms")
    mean = lambda key: sum(getattr(r, key) for r in results) / len(results)  # noqa: E731
    summary = {
        "model": args.model, "dataset": args.dataset, "device": args.device, "backend": args.backend,
        "compile": args.compile, "precision": args.precision, "matmul_precision": args.matmul_precision,
        "maxk": args.maxk, "maxk_linear_first": args.maxk_linear_first, "minibatch": args.minibatch,
        "batch_size": (args.batch_size or 1024) if args.minibatch else None,
        "epochs": args.epochs, "runs": args.runs, "seeds": [r.seed for r in results],
        "val_acc": mean("val_acc"), "test_acc": mean("test_acc"),
        "test_acc_at_best_val": mean("test_acc_at_best_val"), "mean_epoch_ms": mean("mean_epoch_ms"),
        "test_acc_per_seed": [r.test_acc for r in results],
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{args.model}{'' if args.maxk is None else f' (maxk {args.maxk})'} on {args.dataset} "
              f"({args.device}, {args.runs} run(s)): "
              f"val {100 * summary['val_acc']:.2f}%  test {100 * summary['test_acc']:.2f}%  "
              f"mean epoch {summary['mean_epoch_ms']:.2f} ms"
              + ("" if args.compile == "none" else f" (compile {args.compile})"))
    return 0


def _cmd_train_distributed(args: argparse.Namespace) -> int:
    """``train --nproc N``: full-graph GCN / GraphSAGE on N processes (``sparsegnn.distributed``)."""
    from .datasets import load
    from .distributed.train import train_distributed

    others = {"--minibatch": args.minibatch is not None, "--reorder": args.reorder is not None,
              "--precision": args.precision != "ieee", "--maxk": args.maxk is not None, "--maxk-linear-first": args.maxk_linear_first,
              "--compile": args.compile != "none", "--runs": args.runs != 1,
              "--matmul-precision": args.matmul_precision != "highest"}   # the workers are other processes
    given = [name for name, on in others.items() if on]
    problem = (f"--nproc must be >= 1, got {args.nproc}" if args.nproc < 1 else
               f"--nproc trains --model gcn or sage, got {args.model}" if args.model not in ("gcn", "sage") else
               f"{', '.join(given)} do not apply with --nproc" if given else None)
    if problem is not None:
        print(f"train: {problem}", file=sys.stderr)
        return 2
    data = load(args.dataset, root=args.root, data_dir=args.data_dir)
    device = "cuda" if args.device.startswith("cuda") else "cpu"
    result = train_distributed(data, args.model, args.nproc, epochs=args.epochs, hidden=args.hidden or 256,
                               num_layers=3 if args.model == "sage" else 2,
                               dropout=0.5 if args.dropout is None else args.dropout, lr=args.lr,
                               weight_decay=args.weight_decay, seed=args.seed, device=device, method=args.partition)
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print(f"{args.model} on {args.dataset} ({args.nproc} x {device}, {result.backend}, partition {args.partition}): "
              f"test {100 * result.test_acc:.2f}%  val {100 * result.val_acc:.2f}%  epoch {result.mean_epoch_ms:.2f} ms, "
              f"halo {result.halo_bytes_per_epoch / 1e6:.2f} MB per epoch, {result.cut_edges} of {result.num_edges} "
              f"edges cut")
    return 0


def _given(value, default):
    """``value`` unless the option was left out (None)."""
    return default if value is None else value


def _graph_problem(args: argparse.Namespace) -> Optional[str]:
    """Why graph-level ``train`` cannot run with the other options (None when it can)."""
    from .graph_training import GRAPH_MODELS, is_graph_dataset
    from .ops._dispatch import runs_on

    if not is_graph_dataset(args.dataset):
        return f"--model {args.model} is a graph-level model; use --dataset tox21, PROTEINS_full, ENZYMES or a file"
    if args.model not in GRAPH_MODELS:
        return f"--dataset {args.dataset} is graph-level; use --model {', '.join(GRAPH_MODELS)}"
    node_only = {"--minibatch": args.minibatch is not None, "--reorder": args.reorder is not None,
                 "--precision": args.precision != "ieee", "--maxk": args.maxk is not None, "--maxk-linear-first": args.maxk_linear_first,
                 "--compile reduce-overhead/default": args.compile in ("reduce-overhead", "default"),
                 "--root": args.root is not None, "--runs": args.runs != 1}
    given = [name for name, on in node_only.items() if on]
    if given:
        return f"{', '.join(given)} apply to node classification; drop them for {args.dataset}"
    if args.batch_size is not None and args.batch_size < 1:
        return f"--batch-size must be >= 1, got {args.batch_size}"
    if not runs_on(args.backend, "cuda" if args.device.startswith("cuda") else "cpu"):
        return f"--backend {args.backend} cannot run on --device {args.device}"
    if args.compile == "capture" and not args.device.startswith("cuda"):
        return "--compile capture needs --device cuda (graph-level training captures its steps there by default)"
    return None


def _cmd_train_graphs(args: argparse.Namespace) -> int:
    """``train`` on a graph-level dataset: molecules (ROC-AUC) or a TU collection (k-fold accuracy)."""
    from .graph_training import resolve_graph_dataset, train_molecules, train_tu_kfold

    problem = _graph_problem(args)
    if problem is not None:
        print(f"train: {problem}", file=sys.stderr)
        return 2
    kind, path = resolve_graph_dataset(args.dataset, args.data_dir)
    progress = not args.json and sys.stderr.isatty() or args.progress
    capture = None if args.compile is None else args.compile == "capture"
    common = dict(hidden=args.hidden, dropout=args.dropout, seed=args.seed, device=args.device, backend=args.backend,
                  progress=progress, weight_decay=_given(args.weight_decay, 0.0), capture=capture)
    if kind == "molecules":
        if args.folds is not None or args.node_attributes:
            print("train: --folds and --node-attributes are for TU collections; molecules use --split", file=sys.stderr)
            return 2
        result = train_molecules(path, args.model, epochs=_given(args.epochs, 50),
                                 batch_size=_given(args.batch_size, 50), split=_given(args.split, "scaffold"),
                                 lr=_given(args.lr, 1e-3), **common)
        summary = result.as_dict()
        line = (f"{args.model} on {result.dataset} ({args.device}, {result.split} split "
                f"{result.num_train}/{result.num_valid}/{result.num_test}, batch {result.batch_size}): "
                f"test ROC-AUC {result.test_auc_at_best_val:.4f} at best val ({result.best_val_auc:.4f}), "
                f"{result.test_auc:.4f} at the last epoch; train {result.train_molecules_per_s:,.0f} molecules/s "
                f"(epoch {result.mean_epoch_ms:.1f} ms), inference {result.inference_molecules_per_s:,.0f} molecules/s "
                f"(batch {result.inference_batch_size})")
    else:
        if args.split is not None:
            print("train: --split is for molecules; TU collections use --folds", file=sys.stderr)
            return 2
        result = train_tu_kfold(path, args.model, epochs=_given(args.epochs, 350),
                                batch_size=_given(args.batch_size, 32), folds=_given(args.folds, 10),
                                lr=_given(args.lr, 0.01), node_attributes=args.node_attributes, **common)
        summary = result.as_dict()
        line = (f"{args.model} on {result.dataset} ({args.device}, {result.folds}-fold, {result.epochs} epochs, "
                f"batch {result.batch_size}): test accuracy {100 * result.test_acc_mean:.2f} +- "
                f"{100 * result.test_acc_std:.2f}% (last epoch), {100 * result.test_acc_best_epoch_mean:.2f} +- "
                f"{100 * result.test_acc_best_epoch_std:.2f}% at the best epoch {result.best_epoch + 1}; "
                f"epoch {result.mean_epoch_ms:.1f} ms ({result.train_graphs_per_s:,.0f} graphs/s)")
    summary["kind"] = kind
    print(json.dumps(summary) if args.json else line)
    return 0


def _add_data_args(parser: argparse.ArgumentParser, graphs: bool = False) -> None:
    parser.add_argument("--dataset", default="cora",
                        help="cora (bundled), citeseer (the data folder's planetoid/ or --root), or a labelled "
                             "real-suite graph: deezer, lastfm, twitch, wikipedia (the data folder's real/; "
                             "stratified 60/20/20 split)"
                             + ("; graph-level: tox21 (molecules/), PROTEINS_full, ENZYMES (tu/), or a "
                                "MoleculeNet-style .csv / a TU .zip path" if graphs else ""))
    parser.add_argument("--root", default=None, help="directory with raw Planetoid files")
    parser.add_argument("--data-dir", default=None,
                        help="the datasets folder (with planetoid/, real/; default: SPARSEGNN_DATA, "
                             "../shared/datasets)")


def _cmd_info(args: argparse.Namespace) -> int:
    from . import __version__
    from .kernels import interpreting, triton_available

    lines = [
        f"sparsegnn {__version__}",
        f"python {platform.python_version()} ({platform.machine()})",
        f"torch {torch.__version__}",
    ]
    if triton_available():
        import triton

        lines.append(f"triton {triton.__version__}" + (" (interpreter: TRITON_INTERPRET=1)" if interpreting() else ""))
    else:
        lines.append("triton not installed")
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        lines.append(f"device cuda:0 {props.name}, {props.multi_processor_count} SMs, "
                     f"{props.total_memory / 2**30:.1f} GiB")
        from .tune.model import MODEL_FILE, model_file

        name = model_file(props.name)
        lines.append(f"cost model: {name}" + (" (the default: no weights fitted on this GPU)" if name == MODEL_FILE
                                               else " (fitted on this GPU)"))
    else:
        lines.append("device cpu (no CUDA device)")
    from .ops._dispatch import auto_backend, available_backends

    lines.append("backends: " + ", ".join(available_backends()))
    # what backend="auto" picks for floating-point tensors, per device
    picks = [f"cpu -> {auto_backend('cpu')}"] + ([f"cuda -> {auto_backend('cuda')}"] if torch.cuda.is_available() else [])
    lines.append("auto: " + ", ".join(picks))
    print("\n".join(lines))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    """``spmm`` on the user's graph against ``torch.sparse.mm`` (the benchmark suites: ``benchmarks/``)."""
    from .benchmark import load_graph, time_graph, time_markdown

    problem = _path_problem(args)
    if problem is not None:
        print(f"bench: {problem}", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench: --device cuda requested but no CUDA device is available", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    rows = time_graph(load_graph(args.graph, device=args.device, data_dir=args.data_dir), args.dims, dtype)
    print(json.dumps({"device": args.device, "graph": args.graph, "rows": rows}) if args.json else time_markdown(rows))
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from .benchmark import precision_markdown, precision_report, tuning_markdown, tuning_report

    problem = _path_problem(args, out_files=[("--out", "out")])
    if problem is not None:
        print(f"tune: {problem}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("tune: needs a CUDA device (it times kernels)", file=sys.stderr)
        return 2
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    graphs, dims = args.graphs.split(","), [int(d) for d in args.dims.split(",")]
    if args.precision:
        rows = [row for dtype in dtypes for row in precision_report(
            graphs, dims, args.precision.split(","), real=not args.stand_ins, data_dir=args.data_dir, dtype=dtype)]
    else:
        rows = tuning_report(graphs, dims, dtypes, real=not args.stand_ins, data_dir=args.data_dir)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print(precision_markdown(rows) if args.precision else tuning_markdown(rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sparsegnn", description="Fast sparse GNN operations for PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a node classifier (full graph, or sampled mini-batches with "
                                         "--minibatch), or a graph classifier (--dataset tox21, PROTEINS_full, ENZYMES)")
    _add_data_args(train, graphs=True)
    train.add_argument("--model", default="gcn", choices=["gcn", "agnn", "sage", "gin", "gat", "chemgcn", "chemgcn-wide"],
                       help="node models: gcn, agnn, sage, gin, gat; graph-level: chemgcn (2 x 64), chemgcn-wide "
                            "(3 x 512), gin (GIN paper: 5 layers of 64, sum pooling)")
    train.add_argument("--epochs", type=_positive_int, default=None,
                       help="default 200 (nodes), 50 (molecules), 350 (TU, the GIN paper's)")
    train.add_argument("--lr", type=_float_in(0.0, open_low=True), default=None, help="default 0.01 (nodes, TU), 0.001 (molecules)")
    train.add_argument("--weight-decay", type=_float_in(0.0), default=None, help="default 5e-4 (nodes), 0 (graph-level)")
    train.add_argument("--hidden", type=_positive_int, default=None, help="hidden width (default: the model's)")
    train.add_argument("--dropout", type=_float_in(0.0, 1.0, open_high=True), default=None, help="dropout (default: the model's)")
    train.add_argument("--device", default=_default_device())
    train.add_argument("--seed", type=_non_negative_int, default=0)
    train.add_argument("--runs", type=_positive_int, default=1, help="repeat with seeds seed, seed+1, ...")
    train.add_argument("--backend", default="auto", choices=["auto", "reference", "triton"])
    train.add_argument("--compile", nargs="?", const="capture", default=None,
                       choices=["none", "capture", "reduce-overhead", "default"],
                       help="run the training step as one CUDA graph replay (capture, the default of a bare "
                            "--compile; CUDA only), through torch.compile(mode='reduce-overhead') (CUDA only) "
                            "or torch.compile (default); none = eager.  Default: none for node classification; "
                            "for graph-level datasets capture on CUDA (steps on batches padded to a few shapes), "
                            "eager on the CPU")
    train.add_argument("--compile-backend", default=None,
                       help="torch.compile backend for --compile reduce-overhead/default (default inductor; "
                            "aot_eager needs no C++ compiler)")
    train.add_argument("--minibatch", nargs="?", type=_fanouts, const=[15, 10], default=None, metavar="FANOUTS",
                       help="train on neighbour-sampled mini-batches (sparsegnn.sampling.NeighborLoader); "
                            "fanouts per hop, comma-separated (default 15,10; -1 = all neighbours)")
    train.add_argument("--nproc", type=_positive_int, default=None,
                       help="full-graph training on N processes over a partitioned graph (torch.distributed: "
                            "NCCL with one GPU each on --device cuda, gloo on the CPU); --model gcn or sage")
    train.add_argument("--partition", default="auto", choices=["auto", "metis", "contiguous"],
                       help="partitioner with --nproc (auto: METIS when pymetis is installed)")
    train.add_argument("--batch-size", type=_positive_int, default=None,
                       help="seed nodes per mini-batch with --minibatch (default 1024); graphs per batch for "
                            "graph-level datasets (default 50 molecules, 32 TU graphs)")
    train.add_argument("--split", default=None, choices=["scaffold", "random"],
                       help="molecules: 80/10/10 Bemis-Murcko scaffold split (default; needs RDKit) or random")
    train.add_argument("--folds", type=_positive_int, default=None, help="TU collections: stratified k-fold (default 10)")
    train.add_argument("--node-attributes", action="store_true",
                       help="TU collections: use the continuous node attributes (standardised) besides the one-hot "
                            "node labels (default: labels only, as the GIN paper and PyG's TUDataset)")
    train.add_argument("--reorder", default=None, choices=["rcm", "degree", "metis", "lpa"],
                       help="renumber the nodes for locality before full-graph training (Graph.reorder)")
    train.add_argument("--precision", default="ieee", choices=["ieee", "tf32", "bf16"],
                       help="aggregation precision: ieee (exact fp32, default), tf32 or bf16 (tensor cores)")
    train.add_argument("--matmul-precision", default="highest", choices=MATMUL_PRECISIONS, help=_MATMUL_HELP)
    train.add_argument("--maxk", type=int, default=None, metavar="K",
                       help="MaxK-GNN: train MaxKGNN (--model sage, gcn or gin) with the MaxK nonlinearity keeping K "
                            "of the hidden entries per row; defaults then hidden 256, 3 layers, dropout 0.5 "
                            "(MaxK-GNN's Table 3)")
    train.add_argument("--maxk-linear-first", action="store_true",
                       help="with --maxk and --model gcn / gin: the authors' GCN / GIN (MaxK on the output of each "
                            "layer's linear map, MaxK-GNN's Eq. 3) instead of MaxK on the layer's input")
    train.add_argument("--json", action="store_true", help="print the final metrics as one JSON line")
    train.add_argument("--progress", action="store_true", help="show the progress bar even when not on a terminal")
    train.set_defaults(func=_cmd_train)

    bench = sub.add_parser("bench", help="time spmm on your graph against torch.sparse (cuSPARSE on CUDA); "
                                         "the full benchmark suites are in the repository's benchmarks folder")
    bench.add_argument("graph", help="a .pt / .pth file (a [2, E] edge_index, or a dict with edge_index and "
                                     "num_nodes), a .npz (edge_index, or row and col), or a stand-in / real-suite name")
    bench.add_argument("--dims", type=_dims, default=[32, 128], help="feature widths, comma-separated (default 32,128)")
    bench.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    bench.add_argument("--device", default=_default_device())
    bench.add_argument("--data-dir", default=None, help="the datasets folder for real-suite names (default: SPARSEGNN_DATA)")
    bench.add_argument("--json", action="store_true", help="print the rows as one JSON line")
    bench.set_defaults(func=_cmd_bench)

    tune = sub.add_parser("tune", help="cost model vs timing: picks, their speed, tuning cost (GPU)")
    tune.add_argument("--graphs", default="cora,wikipedia,deezer,reddit-threads-10k")
    tune.add_argument("--dims", default="32,128")
    tune.add_argument("--dtypes", default="float32")
    tune.add_argument("--stand-ins", action="store_true", help="graph names are synthetic stand-ins")
    tune.add_argument("--data-dir", default=None)
    tune.add_argument("--precision", default=None, type=_precisions,
                      help="comma-separated tf32,bf16: report what each precision mode buys (per case: the pick, "
                           "its time, the best candidate's, the exact call's, and the eager call against the exact one)")
    tune.add_argument("--out", default=None, help="JSON rows")
    tune.set_defaults(func=_cmd_tune)

    info = sub.add_parser("info", help="versions, device and available backends")
    info.set_defaults(func=_cmd_info)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:   # a file or folder failing mid-run: one line, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
