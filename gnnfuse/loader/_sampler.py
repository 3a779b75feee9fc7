"""``NeighborSampler``: PyG's ``BaseSampler`` with gnnfuse's own uniform neighbour sampling.

It plugs into PyG's ``NodeLoader`` (see :class:`gnnfuse.loader.NeighborLoader`) without pyg-lib or
torch-sparse: a multithreaded C++ kernel on CPU (csrc/sampler.cpp), torch ops on CUDA
(``_torch_sampling``). Either way every hop's edges come out grouped by target, and the batch's
edge list is sorted by target as a whole (hop k's targets are the nodes hop k - 1 added, numbered
after all earlier ones), so :meth:`gnnfuse.CSR.from_sorted_edge_index` builds its CSR without a
sort, and each GNN layer's bipartite graph is a prefix of it (:func:`layer_csrs`).
"""
from __future__ import annotations

import os
import threading
import warnings

import torch
from torch_geometric.sampler import BaseSampler, NodeSamplerInput, SamplerOutput

from .._build import optional_extension
from ..constants import INT32_MAX, SEED_BOUND
from ..csr import _check
from ..ops.coo_to_csr import coo_to_csr
from . import _torch_sampling

# each call's kernel seed: (seed + calls * CALL_STRIDE) % SEED_MODULUS, so successive batches draw apart
CALL_STRIDE, SEED_MODULUS = 104_729, SEED_BOUND - 1

_SUBGRAPH_TYPES = ("directional",)


def triton_errors() -> type[Exception]:
    """Triton's compile-error base class where Triton is installed (else a class nothing raises)."""
    try:
        from triton.compiler.errors import CompilationError
        return CompilationError
    except ImportError:
        return _NeverRaised


class _NeverRaised(Exception):
    pass


def _extension_or_none():
    return optional_extension("sampler", "sampler unavailable, sampling with torch ops", stacklevel=3)


class NeighborSampler(BaseSampler):
    """Uniform neighbour sampling of a homogeneous graph, hop by hop, by in-edges (PyG's
    ``source_to_target`` flow: a node's neighbours are the sources of its incoming edges).

    Args:
        data: a PyG ``Data`` (its ``edge_index`` and ``num_nodes``) or an ``edge_index`` [2, E]
            (then pass ``num_nodes``).
        num_neighbors: fan-out per hop, e.g. ``[15, 10, 5]``; ``-1`` takes every neighbour.
        replace: sample with replacement (a neighbour may repeat; every node with in-edges gets
            exactly fan-out edges).
        subgraph_type: "directional" (the sampled edges only; PyG's default).
        disjoint: one subgraph per seed (a node reached from two seeds appears twice); the
            batch's ``batch`` vector names each node's seed. Uses the torch-ops implementation.
        seed: makes the samples reproducible: the same seed and the same sequence of calls give
            the same batches (on one device; CPU and CUDA draw different streams).
        device: where the graph lives and sampling runs: "cpu" (C++ kernel) or a CUDA device
            (torch ops; seeds may be given on either device).
        num_nodes: the node count when ``data`` is an ``edge_index``.

    The graph is stored once, by target (CSC), int32 where it fits: 4 bytes per edge plus 8 per
    node, plus an edge permutation (8 bytes per edge) for ``edge_permutation``.

    On CUDA each hop's picks run as one Triton kernel (``picks = "auto"``; "torch" takes the
    torch-ops picks there too, "triton" also on CPU tensors under ``TRITON_INTERPRET=1``), and with
    every fan-out >= 0 a batch reads its sizes back to the host once.
    """

    picks = "auto"  # "auto" (Triton on CUDA, torch ops elsewhere) | "triton" | "torch"

    def __init__(self, data, num_neighbors: list[int], *, replace: bool = False,
                 subgraph_type: str = "directional", disjoint: bool = False, seed: int | None = None,
                 device: str | torch.device = "cpu", num_nodes: int | None = None):
        if subgraph_type not in _SUBGRAPH_TYPES:
            raise NotImplementedError(f"subgraph_type={subgraph_type!r}: only {_SUBGRAPH_TYPES} is implemented")
        self.num_neighbors = [int(k) for k in num_neighbors]
        if any(k < -1 for k in self.num_neighbors):
            raise ValueError(f"num_neighbors must hold fan-outs >= 0 or -1 (all); got {num_neighbors}")
        edge_index = data if isinstance(data, torch.Tensor) else data.edge_index
        if num_nodes is None:
            num_nodes = data.num_nodes if not isinstance(data, torch.Tensor) else int(edge_index.max()) + 1
        self.num_nodes = int(num_nodes)
        self.replace, self.disjoint, self.subgraph_type = bool(replace), bool(disjoint), subgraph_type
        self.device = torch.device(device)
        edge_index = edge_index.as_subclass(torch.Tensor).to(self.device)  # sorted by target where it will live
        index_dtype = torch.int32 if max(self.num_nodes, edge_index.shape[1]) < INT32_MAX else torch.int64
        colptr, row, perm = coo_to_csr(edge_index[1], edge_index[0], self.num_nodes, self.num_nodes, index_dtype)
        self.colptr, self.row = colptr.long(), row
        self.perm = perm.long()  # CSC position -> original edge id
        self.generator = torch.Generator(self.device)
        # no seed: fresh entropy, leaving torch's global generator untouched
        self.generator.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") % 2**62)
        self._kernel_seed, self._calls = int(self.generator.initial_seed()) % SEED_MODULUS, 0
        self._lock = threading.Lock()  # the scratch maps below serve one call at a time
        self._local = torch.full((self.num_nodes + 1,), -1, dtype=torch.long, device=self.device)  # + a sink
        self._first = torch.full((self.num_nodes + 1,), _torch_sampling.UNSEEN, dtype=torch.long, device=self.device)
        self._ext = _extension_or_none() if self.device.type == "cpu" and not self.disjoint else None

    def to(self, device: str | torch.device) -> NeighborSampler:
        """A sampler of the same graph, fan-outs and seed on ``device`` (the graph copied, not re-sorted)."""
        moved = object.__new__(NeighborSampler)
        moved.__dict__.update(self.__dict__)
        moved.device = torch.device(device)
        moved.colptr, moved.row = self.colptr.to(moved.device), self.row.to(moved.device)
        moved.generator = torch.Generator(moved.device)
        moved.generator.manual_seed(int(torch.randint(2**62, (1,), generator=self.generator, device=self.device)))
        moved._kernel_seed, moved._calls = int(moved.generator.initial_seed()) % SEED_MODULUS, 0
        moved._lock = threading.Lock()
        moved._local = torch.full_like(self._local, -1, device=moved.device)
        moved._first = torch.full_like(self._first, _torch_sampling.UNSEEN, device=moved.device)
        moved._ext = _extension_or_none() if moved.device.type == "cpu" and not self.disjoint else None
        return moved

    @property
    def edge_permutation(self) -> torch.Tensor:
        return self.perm

    def sample(self, seeds: torch.Tensor, input_id: torch.Tensor | None = None,
               seed_time: torch.Tensor | None = None) -> SamplerOutput:
        """Samples around ``seeds`` [B] (global node ids); ``node[:B]`` are the seeds, in order."""
        seeds = seeds.to(self.device, torch.long).contiguous()
        if seeds.numel():  # on the GPU a device-side assertion: reading the ids back would wait for the device
            low, high = torch.aminmax(seeds)
            _check((low >= 0) & (high < self.num_nodes), seeds.is_cpu, f"seed nodes must lie in [0, {self.num_nodes})")
        batch = None
        with self._lock:
            if self.disjoint:
                *out, batch = _torch_sampling.sample_disjoint(self.colptr, self.row, seeds, self.num_neighbors,
                                                              self.replace, self.generator, self.num_nodes)
            elif self._ext is not None:
                stream_seed = int(torch.randint(2**62, (1,), generator=self.generator))
                node, row, col, edge, per_hop_nodes, per_hop_edges = self._ext.neighbor_sample(
                    self.colptr, self.row, seeds, self.num_neighbors, self.replace, stream_seed,
                    self._local, self._first)
                out = [node, row, col, edge, per_hop_nodes.tolist(), per_hop_edges.tolist()]
            else:
                kernel_seed = None
                if self.picks == "triton" or (self.picks == "auto" and self.device.type == "cuda"):
                    self._calls += 1
                    kernel_seed = (self._kernel_seed + self._calls * CALL_STRIDE) % SEED_MODULUS
                out = self._sample_torch(seeds, kernel_seed)
        node, row, col, edge, per_hop_nodes, per_hop_edges = out
        return SamplerOutput(node=node, row=row, col=col, edge=edge, batch=batch,
                             num_sampled_nodes=per_hop_nodes, num_sampled_edges=per_hop_edges,
                             metadata=(input_id, seed_time))

    def _sample_torch(self, seeds: torch.Tensor, kernel_seed: int | None) -> list:
        try:
            return list(_torch_sampling.sample(self.colptr, self.row, seeds, self.num_neighbors, self.replace,
                                               self.generator, self._local, self._first, kernel_seed))
        except (ImportError, RuntimeError, triton_errors()) as exc:  # e.g. a Triton that cannot compile the picks
            if kernel_seed is None:
                raise
            warnings.warn(f"gnnfuse: the Triton neighbour picks failed ({type(exc).__name__}: {exc}); "
                          "sampling with torch ops instead", stacklevel=3)
            self.picks = "torch"
            self._local.fill_(-1)  # scratch maps as they came (a failed call may have left marks)
            self._first.fill_(_torch_sampling.UNSEEN)
            return self._sample_torch(seeds, None)

    def sample_from_nodes(self, index: NodeSamplerInput, **kwargs) -> SamplerOutput:
        if index.time is not None:
            raise NotImplementedError("gnnfuse.loader.NeighborSampler: temporal sampling is not implemented")
        return self.sample(index.node, index.input_id, index.time)

    def sample_from_edges(self, index, neg_sampling=None):
        raise NotImplementedError("gnnfuse.loader.NeighborSampler samples from nodes only (NodeLoader / "
                                  "NeighborLoader); link-level sampling is not implemented")
