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
    # each entry to 2^-11 of itself, or to 2^-29 of its row's largest (fp16's smallest normal)
    bound = torch.maximum(x.double().abs() * 2.0**-11, row_max * 2.0**-29) * (1 + 1e-6)
    assert bool((err <= bound).all()), float((err / bound.clamp_min(1e-300)).max())
    assert float(h[0].abs().max()) == 0.0                     # a zero row stays zero


def test_packing_reads_strided_rows_and_keeps_non_finite_entries():
    from sparsegnn.kernels.pack import pack_fp16

    base = torch.randn(8, 40)
    x = base[:, 5:29]                                          # row stride 40, not contiguous
    x[2, 3] = float("inf")
    x[4, 0] = float("nan")
    h, inv = pack_fp16(x.to(DEVICE))
    h, inv = h.cpu().float(), inv.cpu()
    assert h[2, 3] == float("inf") and float(inv[2]) == 1.0  # a row with inf: stored unscaled
    assert math.isnan(float(h[4, 0]))
    ok = [r for r in range(8) if r not in (2, 4)]
    assert torch.allclose(h[ok] * inv[ok, None], x[ok], rtol=2.0**-10, atol=0)
    with pytest.raises(ValueError, match=r"pack_fp16\(\): x must be a 2-D float32"):
        pack_fp16(x.double().to(DEVICE))
    h0, inv0 = pack_fp16(torch.empty(3, 0, device=DEVICE))
    assert h0.shape == (3, 0) and inv0.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("width", [24, 160])
def test_the_packed_spmm_is_as_accurate_as_tf32_on_rows_of_any_magnitude(width):
    """Path 3 of the ``spmm_tc`` decisions against float64 with tf32's element-wise bound
    ``|out - A x| <= 2^-10 |A| |x|``, on rows of magnitudes 1e-30 ... 1e30, weighted and not."""
    from sparsegnn.ops.tiles import _run_sum

    n = 40
    ei, w = random_graph(n, 200, seed=3, num_isolated=3, num_empty_rows=4, num_self_loops=4,
                         num_duplicates=5, weighted=True)
    g = Graph.from_edge_index(ei, w, num_nodes=n).to(DEVICE)
    x64 = _spread_rows(n, width, seed=7)
    x = x64.float().to(DEVICE)
    for weight, dense in ((g.edge_val, dense_adjacency(ei, n, w)), (None, dense_adjacency(ei, n))):
        out = _run_sum(g, x, weight, "tf32", {"path": 3})
        assert out.dtype == torch.float32 and out.shape == (n, width)
        x32 = x.double().cpu()
        err = (out.double().cpu() - dense @ x32).abs()
        assert bool((err <= 2.0**-10 * (dense.abs() @ x32.abs()) + 1e-300).all())
