"""gnnfuse: fused gather-scatter message passing for PyTorch."""
__version__ = "0.1.0"

from ._validate import IndexOutOfRange
from .csr import CSR
from .explain import KernelPlan, explain, show_config
from .locality import LocalityStats, locality_stats
from .ordering import reorder
from .ops.attention import gat_attention
from .ops.edge_message import gine_aggregate
from .ops.edge_softmax import edge_softmax
from .ops.gather_scatter import REDUCTIONS, fused_gather_scatter
from .ops.pair_attention import dot_attention, gatv2_attention
from .ops.planarity import planarity_nll
from .ops.structured_scatter import structured_scatter_add
from .scatter import scatter, scatter_max, scatter_min, segment_coo, segment_csr  # torch_scatter's API
from . import graphs, nn, ordering  # noqa: E402  (nn: PyG drop-in; imports torch_geometric lazily)

__all__ = ["CSR", "IndexOutOfRange", "KernelPlan", "LocalityStats", "REDUCTIONS", "dot_attention", "edge_softmax",
           "explain", "fused_gather_scatter", "gat_attention", "gatv2_attention", "gine_aggregate", "graphs",
           "locality_stats", "nn", "ordering", "planarity_nll", "reorder", "scatter", "scatter_max", "scatter_min",
           "segment_coo", "segment_csr", "show_config", "structured_scatter_add"]
