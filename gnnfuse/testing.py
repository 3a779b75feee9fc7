"""Helpers shared by the test suite and benchmarks: graphs, dtypes, tolerances, data paths."""
from __future__ import annotations

import torch

from .datasets import data_root  # noqa: F401  (re-exported for tests)

VALUE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)

# (atol, rtol) against a float64 reference, per value dtype
TOLERANCES = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-2, 2e-2),
    torch.bfloat16: (1e-1, 5e-2),
}


def random_graph(num_src: int, num_dst: int, num_edges: int, *, seed: int = 0, power_law: bool = False,
                 index_dtype: torch.dtype = torch.int64, device: str | torch.device = "cpu") -> torch.Tensor:
    """edge_index [2, E] with uniform sources and uniform or Zipf-like (power-law) targets."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, max(num_src, 1), (num_edges,), generator=g)
    if power_law and num_dst > 0 and num_edges > 0:
        ranks = torch.arange(1, num_dst + 1, dtype=torch.float64)
        dst = torch.multinomial(1.0 / ranks, num_edges, replacement=True, generator=g)
        dst = torch.randperm(num_dst, generator=g)[dst]  # hubs at random ids, not at 0
    else:
        dst = torch.randint(0, max(num_dst, 1), (num_edges,), generator=g)
    return torch.stack([src, dst]).to(index_dtype).to(device)


def hub_graph(num_nodes: int, hub_degree: int, num_hubs: int = 2, *, seed: int = 0) -> torch.Tensor:
    """A few targets with hub_degree in-edges each; every other target is empty."""
    g = torch.Generator().manual_seed(seed)
    dst = torch.arange(num_hubs).repeat_interleave(hub_degree) * (num_nodes // max(num_hubs, 1))
    src = torch.randint(0, num_nodes, (dst.numel(),), generator=g)
    return torch.stack([src, dst])


def through_registered_op():
    """A context manager that makes the public functions take their registered torch.library op
    instead of the eager shortcut (any active dispatch mode does; this one changes nothing else)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    return PassThrough()


class TwoLayerNet(torch.nn.Module):
    """``conv2(relu(conv1(x, graph)), graph)`` for any conv class: the model the nn tests and the
    end-to-end benchmark compare between stock PyG and gnnfuse.nn."""

    def __init__(self, conv, f_in: int, hidden: int, f_out: int, **kw):
        super().__init__()
        self.conv1, self.conv2 = conv(f_in, hidden, **kw), conv(hidden, f_out, **kw)

    def forward(self, x, graph):
        return self.conv2(self.conv1(x, graph).relu(), graph)
