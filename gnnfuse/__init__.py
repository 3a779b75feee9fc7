"""gnnfuse: fused gather-scatter message passing for PyTorch."""
__version__ = "0.1.0"

from ._validate import IndexOutOfRange
from .csr import CSR
from .explain import KernelPlan, explain, show_config
from .ops.attention import gat_attention
from .ops.edge_softmax import edge_softmax
from .ops.gather_scatter import REDUCTIONS, fused_gather_scatter
from .ops.planarity import planarity_nll
from .ops.structured_scatter import structured_scatter_add
from . import nn  # noqa: E402  (PyG drop-in; imports torch_geometric lazily)

__all__ = ["CSR", "IndexOutOfRange", "KernelPlan", "REDUCTIONS", "edge_softmax", "explain", "fused_gather_scatter",
           "gat_attention", "nn", "planarity_nll", "show_config", "structured_scatter_add"]
