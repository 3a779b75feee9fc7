"""A mini-batch training step captured once as a CUDA graph and replayed for every batch.

On a sampled batch the fused step is bound by host time: some hundred kernel launches and the
Python around them cost more than the kernels (benchmarks/results/minibatch_*). A CUDA graph
(``torch.cuda.CUDAGraph``, public API) records the step's kernels once and replays them with one
call. It needs the same shapes and memory every time, so each batch is padded to fixed per-hop
sizes (:class:`gnnfuse.loader.HopPadding`) and copied into static input buffers; graph preparation
(``layer_csrs``, the transposes), forward, loss, backward and optimizer step all replay from the
graph, and nothing in the step reads the device back.

Sequence: the first ``warmup`` batches run eagerly on a side stream (Triton compiles, the
optimizer builds its state, DDP sets up its buckets), the next is captured on that same stream and
replayed. Under DistributedDataParallel that stream must be the one DDP was built on (PyTorch's
recipe for capturing a whole DDP step): DDP keeps each parameter's gradient accumulator, which
remembers the stream it was created on, and a backward on another stream makes autograd warn of
an "AccumulateGrad stream mismatch" and add cross-stream waits. A batch
that does not fit the capacities grows them: one eager step at the new shapes, then a new capture.
Every call is a real training step on its batch. Without CUDA (or with ``capture=False``) the
padded step runs eagerly: the same padding, for tests on CPU.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch

from ._padded import HopPadding

IGNORE = -100  # label of the padded seed slots (F.cross_entropy's default ignore_index)


class CapturedStep:
    """``CapturedStep(step, features)(node, edge_index, num_sampled_nodes, num_sampled_edges, y) -> loss``.

    Args:
        step: ``step(x, y, edge_index, num_sampled_nodes, num_sampled_edges) -> loss`` runs one
            whole training step on a padded batch: ``optimizer.zero_grad(set_to_none=True)``, the
            model on ``x`` [num_nodes, F] and the layer graphs of ``edge_index`` (e.g.
            ``gnnfuse.loader.layer_csrs(edge_index=edge_index, ...)``), a loss that skips labels
            equal to -100 (``F.cross_entropy``'s default; ``y`` holds one label per seed slot, -100
            in the padded ones), ``loss.backward()``, ``optimizer.step()``; returns the loss. Nothing
            in it may read the device back; the optimizer must be capturable (e.g.
            ``torch.optim.Adam(..., capturable=True)``).
        features: the node feature table the batch's ``node`` ids index (on the device).
        capture: capture and replay (CUDA only); False runs the padded step eagerly.
        warmup: eager steps before the first capture (11 under DistributedDataParallel, as its
            documentation asks).
        padding: a :class:`HopPadding` (default ``HopPadding()``).
        stream: the side stream for the eager warm-up and the capture; under DDP the stream the
            ``DistributedDataParallel`` wrapper was constructed on (default: a new stream).

    Returns each step's loss (a fresh device tensor). ``captures`` counts the captures so far.
    """

    def __init__(self, step: Callable, features: torch.Tensor, *, capture: bool = True, warmup: int = 3,
                 padding: HopPadding | None = None, stream: torch.cuda.Stream | None = None):
        self.step, self.features = step, features
        self.padding = padding or HopPadding()
        self.capture = bool(capture) and features.is_cuda
        self.warmup = int(warmup)
        self.captures = 0
        self._eager_left = self.warmup
        self._graph: torch.cuda.CUDAGraph | None = None
        self._loss: torch.Tensor | None = None
        self._static: tuple | None = None
        self._side = (stream or torch.cuda.Stream(features.device)) if self.capture else None

    def __call__(self, node: torch.Tensor, edge_index: torch.Tensor, num_sampled_nodes: Sequence[int],
                 num_sampled_edges: Sequence[int], y: torch.Tensor) -> torch.Tensor:
        """One training step on this batch: :meth:`load`, then :meth:`run`."""
        self.load(node, edge_index, num_sampled_nodes, num_sampled_edges, y)
        return self.run()

    def load(self, node: torch.Tensor, edge_index: torch.Tensor, num_sampled_nodes: Sequence[int],
             num_sampled_edges: Sequence[int], y: torch.Tensor) -> None:
        """Pads the batch into the static inputs and gathers its features there (a few launches, no
        host sync); grows the capacities first if it does not fit (the next :meth:`run` then runs
        eagerly and captures again)."""
        if not self.padding.fits(num_sampled_nodes, num_sampled_edges):
            self.padding.grow(num_sampled_nodes, num_sampled_edges)
            self._graph = self._loss = self._static = None  # new shapes: capture again after an eager step
            self._eager_left = max(self._eager_left, 1)
        if self._static is None:
            self._static = self._buffers(edge_index.dtype, node.dtype, y.dtype)
        x, labels, ei, slots = self._static
        self.padding.pad(edge_index, node, num_sampled_nodes, num_sampled_edges, out=(ei, slots))
        torch.index_select(self.features, 0, slots, out=x)
        labels.fill_(IGNORE)
        labels[: y.shape[0]].copy_(y)

    def run(self) -> torch.Tensor:
        """The training step on the loaded batch: replayed, or eager (warm-up), or captured and replayed."""
        x, labels, ei, _ = self._static
        nodes, edges = self.padding.padded_sizes()
        if self._graph is not None:
            self._graph.replay()
            return self._loss.clone()
        if self.capture and self._eager_left <= 0:
            try:
                graph = torch.cuda.CUDAGraph()
                # on the warm-up's stream; thread_local: a sampler thread (train_ddp --prefetch) may
                # read sizes back meanwhile
                with torch.cuda.graph(graph, stream=self._side, capture_error_mode="thread_local"):
                    loss = self.step(x, labels, ei, nodes, edges)
            except Exception as exc:  # noqa: BLE001  (whatever the step cannot do under capture: run it eagerly)
                warnings.warn(f"gnnfuse CapturedStep: capturing the step failed ({type(exc).__name__}: {exc}); "
                              "running it eagerly from now on", stacklevel=2)
                self.capture = False
            else:
                self._graph, self._loss = graph, loss
                self.captures += 1
                graph.replay()  # capturing ran nothing: this batch's step
                return loss.clone()
        self._eager_left -= 1
        if not self.capture:
            return self.step(x, labels, ei, nodes, edges)
        main = torch.cuda.current_stream(x.device)
        self._side.wait_stream(main)
        with torch.cuda.stream(self._side):  # warm-up on a side stream, as torch.cuda.graphs asks
            loss = self.step(x, labels, ei, nodes, edges)
        main.wait_stream(self._side)
        return loss

    def _buffers(self, index_dtype, node_dtype, label_dtype):
        """The static inputs at the current capacities: features, labels, edge_index, node ids."""
        device = self.features.device
        p = self.padding
        x = torch.empty(p.num_nodes, *self.features.shape[1:], dtype=self.features.dtype, device=device)
        labels = torch.full((p.node_caps[0],), IGNORE, dtype=label_dtype, device=device)
        ei = torch.empty(2, p.num_edges, dtype=index_dtype, device=device)
        slots = torch.empty(p.num_nodes, dtype=node_dtype, device=device)
        return x, labels, ei, slots
