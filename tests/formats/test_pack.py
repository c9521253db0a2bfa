"""fp16 packing with a scale per row (kernels/pack.py) and the SpMM path that gathers it.

Without a GPU the kernel runs in the Triton interpreter (conftest)."""
import math

import pytest
import torch

from conftest import DEVICE, dense_adjacency
from sparsegnn import Graph
from sparsegnn.datasets import random_graph

pytest.importorskip("triton")


def _spread_rows(n: int, width: int, seed: int) -> torch.Tensor:
    """Rows of magnitudes 1e-30 ... 1e30 (far outside fp16's range unscaled), a zero row and
    a row of one large and many tiny entries."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, width, generator=gen, dtype=torch.float64)
    x *= torch.logspace(-30, 30, n, dtype=torch.float64)[torch.randperm(n, generator=gen)][:, None]
    x[0] = 0.0
    x[1] = 1e-12
    x[1, 0] = 3.0
    return x


@pytest.mark.parametrize("width", [1, 24, 256, 300])
def test_packed_rows_keep_eleven_significant_bits_of_every_row(width):
    from sparsegnn.kernels.pack import pack_fp16

    x64 = _spread_rows(40, width, seed=width)
    x = x64.float()
    assert not torch.isfinite(x.half()).all() or width == 1    # unscaled, fp16 overflows / flushes
    h, inv = pack_fp16(x.to(DEVICE))
    assert h.dtype == torch.float16 and inv.dtype == torch.float32 and h.shape == x.shape and inv.shape == (40,)
    h, inv = h.cpu().double(), inv.cpu().double()
    assert torch.isfinite(h).all() and torch.isfinite(inv).all()
    assert float(h.abs().max()) <= 32768.0
    row_max = x.double().abs().amax(1, keepdim=True)
    err = (h * inv[:, None] - x.double()).abs()
    # the documented bound: 2^-11 of the entry plus 2^-40 of its row's largest magnitude
    bound = (x.double().abs() * 2.0**-11 + row_max * 2.0**-40) * (1 + 1e-6)
    assert bool((err <= bound).all()), float((err / bound.clamp_min(1e-300)).max())
    assert float(h[0].abs().max()) == 0.0                     # a zero row stays zero


def test_packing_reads_strided_rows_and_keeps_non_finite_entries():
    from sparsegnn.kernels.pack import pack_fp16

    base = torch.randn(8, 40)
    x = base[:, 5:29]                                          # row stride 40, not contiguous
    x[2, 3] = float("inf")
    x[2, 4] = 1e10                                             # beyond fp16's range unscaled
    x[4, 0] = float("nan")
    h, inv = pack_fp16(x.to(DEVICE))
    h, inv = h.cpu().float(), inv.cpu()
    assert h[2, 3] == float("inf") and math.isnan(float(h[4, 0]))
    finite = torch.isfinite(x)
    # the rest of those rows is scaled by its own finite maximum (1e10 stays finite), within
    # the documented bound like any other row
    row_max = torch.where(finite, x.abs(), 0.0).amax(1, keepdim=True).double()
    err = ((h * inv[:, None]).double() - x.double()).abs()
    bound = (x.double().abs() * 2.0**-11 + row_max * 2.0**-40) * (1 + 1e-6)
    assert bool((err <= bound)[finite].all()) and float(h[2, 4]) * float(inv[2]) == pytest.approx(1e10, rel=2.0**-11)
    with pytest.raises(ValueError, match=r"pack_fp16\(\): x must be a 2-D float32"):
        pack_fp16(x.double().to(DEVICE))
    h0, inv0 = pack_fp16(torch.empty(3, 0, device=DEVICE))
    assert h0.shape == (3, 0) and inv0.tolist() == [1.0, 1.0, 1.0]


def _packed_bound(dense: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The documented error bound of the packed path (``kernels/pack.py``) with fp32 sums:
    ``|A| (2^-10 |x| + 2^-39 max_f |x_jf|)`` element-wise."""
    row_max = x.abs().amax(1, keepdim=True)
    return dense.abs() @ (2.0**-10 * x.abs() + 2.0**-39 * row_max)


@pytest.mark.parametrize("width", [24, 160])
def test_the_packed_spmm_keeps_its_documented_bound_on_rows_of_any_magnitude(width):
    """Path 3 of the tf32 decisions against float64, element-wise within the documented bound,
    on rows of magnitudes 1e-30 ... 1e30, weighted and not."""
    from sparsegnn.ops.tiles import _run_sum

    n = 40
    ei, w = random_graph(n, 200, seed=3, num_isolated=3, num_empty_rows=4, num_self_loops=4,
                         num_duplicates=5, weighted=True)
    g = Graph.from_edge_index(ei, w, num_nodes=n).to(DEVICE)
    x = _spread_rows(n, width, seed=7).float().to(DEVICE)
    x64 = x.double().cpu()
    for weight, dense in ((g.edge_val, dense_adjacency(ei, n, w)), (None, dense_adjacency(ei, n))):
        out = _run_sum(g, x, weight, "tf32", {"path": 3})
        assert out.dtype == torch.float32 and out.shape == (n, width)
        err = (out.double().cpu() - dense @ x64).abs()
        assert bool((err <= _packed_bound(dense, x64) + 1e-300).all())


def test_the_packed_spmm_drops_what_lies_far_below_its_rows_largest_entry():
    """The limitation the docs state: one edge 1 -> 0 and a source row [3, 1e-12, 1e-9]: the
    entry 2^-41 of its row's largest may round to zero (tf32 would keep it), within the bound."""
    from sparsegnn.ops.tiles import _run_sum

    g = Graph.from_edge_index(torch.tensor([[1], [0]]), num_nodes=2).to(DEVICE)
    x = torch.tensor([[0.0, 0.0, 0.0], [3.0, 1e-12, 1e-9]])
    out = _run_sum(g, x.to(DEVICE), None, "tf32", {"path": 3}).cpu().double()
    want = torch.tensor([[3.0, 1e-12, 1e-9], [0.0, 0.0, 0.0]], dtype=torch.float64)
    dense = torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    assert bool(((out - want).abs() <= _packed_bound(dense, x.double())).all())
    assert abs(float(out[0, 1]) - 1e-12) <= 3.0 * 2.0**-40          # at most 2^-40 of the row's largest
    assert float(out[0, 0]) == 3.0
