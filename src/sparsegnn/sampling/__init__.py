"""Mini-batch training: uniform neighbour sampling on the graph's device, PyG-compatible batches.

PyG's ``NeighborLoader`` needs pyg-lib or torch-sparse; this package samples with torch ops
alone, on the GPU when the graph is there (no copy of the graph to the host, no Python loop
over nodes), and yields the same mini-batches:

>>> from sparsegnn.sampling import NeighborLoader
>>> loader = NeighborLoader(graph, num_neighbors=[15, 10], batch_size=1024, input_nodes=train_mask, x=x, y=y)
>>> for batch in loader:                       # torch_geometric.data.Data (or MiniBatch without PyG)
...     out = model(batch.x, batch.graph)[:batch.batch_size]     # sparsegnn layers: the sub-graph's Graph
...     out = pyg_model(batch.x, batch.edge_index)[:batch.batch_size]   # PyG layers: edge_index

* :func:`sample_neighbors` samples one batch around given seeds.
* :class:`NeighborSampler` keeps the per-graph state (a scratch array) for repeated sampling.
* :class:`NeighborLoader` iterates over batches of seeds.
* :func:`layer_graphs` gives each layer of a model the prefix of the sub-graph it needs
  (``h = conv((h[:g.num_src], h[:g.num_nodes]), g)``): no layer computes rows that no later layer reads.
* :class:`MiniBatchPadding` pads batches to a few shapes for captured training steps
  (``sparsegnn.capture.CapturedGraphSteps``; ``train_minibatch(capture=True)``);
  :class:`TrimmedMiniBatchPadding` does it for models run on ``layer_graphs``.
"""
from ._core import SampleOutput
from .batch import MiniBatch, make_batch
from .loader import NeighborLoader
from .padding import MiniBatchPadding, StaticMiniBatch, StaticTrimmedMiniBatch, TrimmedMiniBatchPadding, minibatch_loss
from .sampler import NeighborSampler, sample_neighbors
from .trim import layer_graphs

__all__ = ["sample_neighbors", "NeighborSampler", "NeighborLoader", "MiniBatch", "SampleOutput", "make_batch",
           "MiniBatchPadding", "StaticMiniBatch", "minibatch_loss", "layer_graphs", "TrimmedMiniBatchPadding",
           "StaticTrimmedMiniBatch"]
