"""Multi-GPU full-graph training on ``torch.distributed``: partitions, halo exchange,
distributed GCN / GraphSAGE, and the launcher behind ``sparsegnn train --nproc N``."""
from .halo import HaloExchange
from .models import DistGCN, DistGraphSAGE, build_dist_model
from .partition import Part, build_parts, load_part, partition_graph, partition_nodes, partition_stats, save_parts
from .train import DistResult, prepare_parts, train_distributed

__all__ = ["Part", "build_parts", "load_part", "partition_graph", "partition_nodes", "partition_stats", "save_parts",
           "HaloExchange", "DistGCN", "DistGraphSAGE", "build_dist_model", "DistResult", "prepare_parts",
           "train_distributed"]
