"""The GPU sampler's hops captured once as a CUDA graph and replayed for every batch of one size.

A [15, 10, 5] batch on the GPU issues about a hundred small launches before its one host sync (the
hop sizes, gnnfuse.loader._torch_sampling): 2.5-3.6 ms per batch in a sampler thread beside the
training step (H200 host, benchmarks/results/minibatch-ddp_*), nearly whatever the batch size, so
with 512 seeds per GPU the sampler -- not the GPUs -- set the pace of data-parallel training at a
fixed global batch. Up to that sync every shape depends only on the
number of seeds and the fan-outs (the hops work on padded [targets x fan-out] buffers), so the
hops are captured once (``torch.cuda.CUDAGraph``, public API) and replayed: one launch, then the
sync, then the compaction (a dozen launches) as before.

The picks' random streams are keyed by the sampler's call counter exactly as in the eager sampler
(the Triton picks kernel reads its seed from a device tensor that the host fills before each
replay), so a captured sampler draws the same batches as the eager one would.
"""
from __future__ import annotations

import torch
from torch_geometric.sampler import SamplerOutput

from ..csr import _check
from . import _torch_sampling
from ._sampler import CALL_STRIDE, SEED_MODULUS, NeighborSampler


class CapturedSampler:
    """``CapturedSampler(sampler, batch_size).sample(seeds)``: ``sampler.sample(seeds)`` with the hops
    replayed from a CUDA graph when ``seeds`` holds ``batch_size`` ids (other sizes: the eager
    sampler). The same batches as the eager sampler, call for call.

    Needs a CUDA ``NeighborSampler`` with the Triton picks, every fan-out >= 0 and not disjoint;
    otherwise (or with ``capture=False``, or when capturing fails: a warning) it samples eagerly.
    The graph is captured at the first full-size batch (after one eager warm-up of the same work).
    One caller at a time (it holds the sampler's lock while sampling).
    """

    def __init__(self, sampler: NeighborSampler, batch_size: int, *, capture: bool = True):
        self.sampler, self.batch_size = sampler, int(batch_size)
        fanouts = sampler.num_neighbors
        self.capture = (bool(capture) and sampler.device.type == "cuda" and not sampler.disjoint
                        and sampler.picks != "torch" and all(k >= 0 for k in fanouts) and len(fanouts) > 0
                        and sampler.row.numel() > 0
                        and _torch_sampling.padded_capacity(self.batch_size, fanouts) <= _torch_sampling.MAX_PADDED)
        self.captures = 0
        self._graph: torch.cuda.CUDAGraph | None = None
        self._hops: _torch_sampling.PaddedHops | None = None
        self._sizes: torch.Tensor | None = None
        self._seeds: torch.Tensor | None = None
        self._call: torch.Tensor | None = None

    def sample(self, seeds: torch.Tensor) -> SamplerOutput:
        """A batch around ``seeds`` (see :meth:`NeighborSampler.sample`)."""
        s = self.sampler
        if not self.capture or seeds.numel() != self.batch_size:
            return s.sample(seeds)
        seeds = seeds.to(s.device, torch.long)
        low, high = torch.aminmax(seeds)
        _check((low >= 0) & (high < s.num_nodes), seeds.is_cpu, f"seed nodes must lie in [0, {s.num_nodes})")
        with s._lock:
            captured = self._graph is not None or self._capture(seeds)
        if not captured:
            return s.sample(seeds)
        with s._lock:
            self._seeds.copy_(seeds)
            s._calls += 1
            self._call.fill_(s._calls)
            self._graph.replay()
            sizes = self._sizes.tolist()  # the one host sync
            node, row, col, edge, nodes, edges = _torch_sampling.finish_padded(self._hops, sizes, s._local)
        return SamplerOutput(node=node, row=row, col=col, edge=edge, batch=None, num_sampled_nodes=nodes,
                             num_sampled_edges=edges, metadata=(None, None))

    def _hops_from_static(self) -> None:
        s = self.sampler
        kernel_seed = (self._call * CALL_STRIDE + s._kernel_seed) % SEED_MODULUS  # NeighborSampler.sample's, on the device
        self._hops = _torch_sampling.padded_hops(s.colptr, s.row, self._seeds, s.num_neighbors, s.replace, None,
                                                 s._local, s._first, kernel_seed)
        self._sizes = torch.stack(self._hops.counts)

    def _capture(self, seeds: torch.Tensor) -> bool:
        """One eager run of the hops (compiles the kernels; draws nothing the batches use), then the
        capture. False (with a warning) if that fails: the sampler then stays eager."""
        import warnings

        s = self.sampler
        device = s.device
        try:
            self._seeds = seeds.clone()
            self._call = torch.zeros((), dtype=torch.long, device=device)  # call 0: never a batch's
            self._hops_from_static()
            _torch_sampling.finish_padded(self._hops, self._sizes.tolist(), s._local)  # resets the scratch maps
            graph = torch.cuda.CUDAGraph()
            # its own stream (torch.cuda.graph's default one is shared by every capture of the process),
            # thread_local: the training step may run (and capture) on the main thread meanwhile
            with torch.cuda.graph(graph, stream=torch.cuda.Stream(device), capture_error_mode="thread_local"):
                self._hops_from_static()
        except Exception as exc:  # noqa: BLE001  (whatever the hops cannot do under capture: stay eager)
            warnings.warn(f"gnnfuse CapturedSampler: capturing the sampler failed ({type(exc).__name__}: {exc}); "
                          "sampling eagerly from now on", stacklevel=3)
            self.capture = False
            self._graph = self._hops = self._sizes = None
            s._local.fill_(-1)  # scratch maps as they came (a failed capture may have left marks)
            s._first.fill_(_torch_sampling.UNSEEN)
            return False
        self._graph = graph
        self.captures += 1
        return True
