"""Counts from input are integers within a limit, checked before anything is allocated for them,
and the file readers name the file (and the line) of what they refuse.

The refused inputs that would ask for gigabytes are tried in a child process whose address
space is capped, and whose peak resident memory is compared with its peak before the calls.
"""
import json
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
import torch

from sparsegnn import Graph
from sparsegnn._checks import MAX_NODES, check_count
from sparsegnn.datasets import load_tu, load_tu_batch, read_edge_list, read_matrix_market, read_npz_graph

EDGES = torch.tensor([[0, 1, 1], [1, 0, 2]])


# ---------------------------------------------------------------- counts must be integers
@pytest.mark.parametrize("value", [3.7, 3.0, np.float64(3.0), "3", True, np.bool_(True), None, torch.tensor(3.0),
                                   torch.tensor([3, 4])])
def test_check_count_refuses_non_integers(value):
    with pytest.raises(ValueError, match=r"^op\(\): n must be an integer"):
        check_count(value, "op", "n")


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3), torch.tensor(3)])
def test_check_count_accepts_integers(value):
    result = check_count(value, "op", "n")
    assert result == 3 and type(result) is int


def test_check_count_bounds():
    assert check_count(MAX_NODES, "op", "n") == MAX_NODES
    with pytest.raises(ValueError, match=r"^op\(\): n = 2147483648 exceeds the limit of 2147483647$"):
        check_count(MAX_NODES + 1, "op", "n")
    with pytest.raises(ValueError, match=r"^op\(\): n must be >= 0, got -1$"):
        check_count(-1, "op", "n")
    with pytest.raises(ValueError, match="exceeds the limit of 10"):
        check_count(11, "op", "n", limit=10)


@pytest.mark.parametrize("value", [3.7, "3", True, 3.0])
def test_from_edge_index_refuses_coerced_node_counts(value):
    with pytest.raises(ValueError, match=r"Graph.from_edge_index\(\): num_nodes must be an integer"):
        Graph.from_edge_index(EDGES, num_nodes=value)


def test_from_edge_index_refuses_coerced_num_src():
    with pytest.raises(ValueError, match=r"Graph.from_edge_index\(\): num_src must be an integer"):
        Graph.from_edge_index(EDGES, num_nodes=3, num_src=2.5)


def test_from_csr_refuses_coerced_counts():
    rowptr, col = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 0, 1])
    with pytest.raises(ValueError, match=r"Graph.from_csr\(\): num_nodes must be an integer"):
        Graph.from_csr(rowptr, col, num_nodes=3.2)
    with pytest.raises(ValueError, match=r"Graph.from_csr\(\): num_src must be an integer"):
        Graph.from_csr(rowptr, col, num_src="3")
    assert Graph.from_csr(rowptr, col, num_nodes=np.int64(3), num_src=torch.tensor(2)).num_src == 2


def test_integer_counts_still_work():
    g = Graph.from_edge_index(EDGES, num_nodes=np.int64(4))
    assert g.num_nodes == 4 and isinstance(g.num_nodes, int)
    g = Graph.from_edge_index(EDGES, num_nodes=torch.tensor(3), num_src=np.int32(2))
    assert (g.num_nodes, g.num_src) == (3, 2)


# ---------------------------------------------------------------- file readers
def _tu(root, name="TOY", labels="0\n2\n1\n1\n0\n", indicator="1\n1\n2\n2\n2\n", edges="1, 2\n2, 1\n3, 4\n"):
    root.mkdir(exist_ok=True)
    (root / f"{name}_A.txt").write_text(edges)
    (root / f"{name}_graph_indicator.txt").write_text(indicator)
    (root / f"{name}_graph_labels.txt").write_text("1\n-1\n")
    (root / f"{name}_node_labels.txt").write_text(labels)
    return root


def test_npz_refuses_float_ids_and_counts(tmp_path):
    path = tmp_path / "g.npz"
    np.savez(path, src=np.array([0.0, 1.5]), dst=np.array([1, 0]), num_nodes=np.array(2))
    with pytest.raises(ValueError, match=r"read_npz_graph\(\): .*g\.npz: src must hold integers"):
        read_npz_graph(path)
    np.savez(path, src=np.array([0, 1]), dst=np.array([1, 0]), num_nodes=np.array(2.9))
    with pytest.raises(ValueError, match=r"g\.npz: num_nodes must hold integers"):
        read_npz_graph(path)
    np.savez(path, src=np.array([0, 1]), dst=np.array([1, 0]), num_nodes=np.array(2 ** 40))
    with pytest.raises(ValueError, match=r"num_nodes of .*g\.npz = 1099511627776 exceeds the limit"):
        read_npz_graph(path)
    np.savez(path, src=np.array([0, 1]), dst=np.array([1, 0]), num_nodes=np.array(2),
             x_indptr=np.array([0, 0, 0]), x_indices=np.zeros(0, np.int64), x_data=np.zeros(0, np.float32),
             x_shape=np.array([2, 2 ** 30 + 1]))
    with pytest.raises(ValueError, match=r"dense features of .*g\.npz"):
        read_npz_graph(path)


def test_npz_truncated_names_the_file(tmp_path):
    path = tmp_path / "cut.npz"
    np.savez(path, src=np.arange(1000), dst=np.arange(1000), num_nodes=np.array(1000))
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(ValueError, match=r"read_npz_graph\(\): cannot read .*cut\.npz"):
        read_npz_graph(path)


def test_edge_list_huge_id_is_refused(tmp_path):
    path = tmp_path / "edges.txt"
    path.write_text("0 1\n1 99999999999\n")
    with pytest.raises(ValueError, match=r"read_edge_list\(\): node count of .*edges\.txt \(largest id \+ 1\) = "
                                         r"100000000000 exceeds the limit"):
        read_edge_list(path)
    path.write_text("0 1\n1 2\n")
    with pytest.raises(ValueError, match=r"read_edge_list\(\): num_nodes must be an integer"):
        read_edge_list(path, num_nodes=5.5)


def test_edge_list_errors_name_file_and_line(tmp_path):
    path = tmp_path / "edges.txt"
    path.write_text("# header\n0 1\n\n1 2x\n2 3\n")
    with pytest.raises(ValueError, match=r"edges\.txt, line 4: '2x' is not a valid integer: '1 2x'"):
        read_edge_list(path)
    path.write_text("# header\n0 1\n1 2\n2\n")
    with pytest.raises(ValueError, match=r"edges\.txt, line 4: expected 2 columns, got 1"):
        read_edge_list(path)
    path.write_text("0 1 0.5\n1 2 nan\n")
    with pytest.raises(ValueError, match=r"edges\.txt, line 2: NaN or infinite value"):
        read_edge_list(path)


def test_matrix_market_huge_size_line_is_refused(tmp_path):
    path = tmp_path / "big.mtx"
    path.write_text("%%MatrixMarket matrix coordinate pattern general\n4000000000 4000000000 1\n1 1\n")
    with pytest.raises(ValueError, match=r"read_matrix_market\(\): row count on the size line of .*big\.mtx = "
                                         r"4000000000 exceeds the limit"):
        read_matrix_market(path)


def test_matrix_market_nan_is_refused_with_its_line(tmp_path):
    path = tmp_path / "nan.mtx"
    path.write_text("%%MatrixMarket matrix coordinate real general\n% comment\n3 3 2\n1 1 1.0\n2 2 nan\n")
    with pytest.raises(ValueError, match=r"read_matrix_market\(\): entries of .*nan\.mtx, line 5: NaN or infinite"):
        read_matrix_market(path)
    path.write_text("%%MatrixMarket matrix coordinate pattern general\n3 3 2\n1 1\n2 q\n")
    with pytest.raises(ValueError, match=r"nan\.mtx, line 4: 'q' is not a valid integer"):
        read_matrix_market(path)


@pytest.mark.parametrize("loader", [load_tu, load_tu_batch])
def test_tu_huge_node_label_is_refused(tmp_path, loader):
    root = _tu(tmp_path / "TOY", labels="0\n2\n1\n100000000\n0\n")
    with pytest.raises(ValueError, match=rf"{loader.__name__}\(\): one-hot width of TOY_node_labels\.txt .* = "
                                         r"100000001 exceeds the limit"):
        loader(root)


def test_tu_huge_graph_id_is_refused(tmp_path):
    root = _tu(tmp_path / "TOY", indicator="1\n1\n2\n2\n1000000000000\n")
    with pytest.raises(ValueError, match=r"load_tu\(\): largest graph id in TOY_graph_indicator\.txt"):
        load_tu(root)


def test_tu_bad_token_names_member_and_line(tmp_path):
    root = _tu(tmp_path / "TOY", edges="1, 2\n2, one\n")
    with pytest.raises(ValueError, match=r"load_tu\(\): TOY_A\.txt, line 2: 'one' is not a valid integer"):
        load_tu(root)
    with pytest.raises(ValueError, match=r"load_tu_batch\(\): TOY_A\.txt, line 2: 'one' is not a valid integer"):
        load_tu_batch(root)


@pytest.mark.parametrize("loader", [load_tu, load_tu_batch])
def test_truncated_zip_names_the_file(tmp_path, loader):
    path = tmp_path / "TOY.zip"
    root = _tu(tmp_path / "TOY")
    with zipfile.ZipFile(path, "w") as zf:
        for member in root.iterdir():
            zf.write(member, f"TOY/{member.name}")
    path.write_bytes(path.read_bytes()[:-40])   # the central directory's end is gone
    with pytest.raises(ValueError, match=rf"{loader.__name__}\(\): .*TOY\.zip is not a readable zip file"):
        loader(path)


# ---------------------------------------------------------------- refused inputs stay small
_CHILD = textwrap.dedent("""
    import json, resource, sys, tempfile, pathlib
    import numpy as np, torch
    from sparsegnn import Graph
    from sparsegnn.datasets import load_tu_batch, read_edge_list, read_matrix_market, read_npz_graph

    tmp = pathlib.Path(tempfile.mkdtemp())
    (tmp / "e.txt").write_text("0 1\\n1 99999999999\\n")
    (tmp / "m.mtx").write_text("%%MatrixMarket matrix coordinate pattern general\\n4000000000 4000000000 1\\n1 1\\n")
    np.savez(tmp / "g.npz", src=np.array([0]), dst=np.array([1]), num_nodes=np.array(2 ** 33))
    tu = tmp / "T"; tu.mkdir()
    for suffix, text in (("A", "1, 2\\n"), ("graph_indicator", "1\\n1\\n"), ("graph_labels", "0\\n"),
                         ("node_labels", "0\\n100000000\\n")):
        (tu / f"T_{suffix}.txt").write_text(text)
    ei = torch.tensor([[0, 1, 1], [1, 0, 1]])
    cases = {
        "num_nodes 2**31 + 5": lambda: Graph.from_edge_index(ei, num_nodes=2 ** 31 + 5),
        "num_nodes 2**40 bipartite": lambda: Graph.from_edge_index(ei, num_nodes=3, num_src=2 ** 40),
        "edge id 2**40": lambda: Graph.from_edge_index(torch.tensor([[0], [2 ** 40]])),
        "edge list id": lambda: read_edge_list(tmp / "e.txt"),
        "matrix market size": lambda: read_matrix_market(tmp / "m.mtx"),
        "npz num_nodes": lambda: read_npz_graph(tmp / "g.npz"),
        "tu node label": lambda: load_tu_batch(tu),
    }
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # A safety net for the code before the checks: allocations of gigabytes fail here instead of
    # swapping the machine (the virtual size in use now, plus 1 GiB).
    with open("/proc/self/statm") as f:
        vsize = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (vsize + 2 ** 30, resource.RLIM_INFINITY))
    out = {}
    for name, call in cases.items():
        try:
            call()
            outcome = "accepted"
        except ValueError as exc:
            outcome = "ValueError: " + str(exc)
        except BaseException as exc:
            outcome = type(exc).__name__ + ": " + str(exc)[:200]
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out[name] = [outcome, (peak - base) / 1024]
    print(json.dumps(out))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and ru_maxrss in KiB (Linux)")
def test_refused_inputs_peak_under_100_mb():
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, (outcome, extra_mb) in results.items():
        assert outcome.startswith("ValueError: ") and "exceeds the limit" in outcome, (name, outcome)
        assert extra_mb < 100, (name, extra_mb)
