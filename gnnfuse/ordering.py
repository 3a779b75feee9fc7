"""Node reordering for locality: ``gnnfuse.reorder`` and the helpers that apply and undo it.

Convention (everything here follows it): ``perm = reorder(edge_index, ...)`` is a permutation of
``range(num_nodes)`` (int64, on edge_index's device) with ``perm[new_id] = old_id``. So

- node features move with ``x_new = x[perm]`` (any node-level tensor: ``y[perm]``, ``mask[perm]``),
- the graph with ``edge_index_new = relabel(edge_index, perm)`` (edge order and edge attributes
  unchanged: edge ``k`` is the same edge before and after),
- a model's node-level output maps back with ``out = unpermute(out_new, perm)`` (= ``out_new[inverse(perm)]``).

Methods (``method=``):

- ``"degree"``: nodes by total degree, highest first (hot rows together; cheap, no community recovery).
- ``"rcm"``: reverse Cuthill-McKee on the symmetrised graph (scipy; bandwidth-minimising, best for
  meshes and other low-degree graphs with large diameter).
- ``"metis"``: METIS partitions of ~``PART_NODES`` nodes, nodes ordered by part (pymetis, the optional
  extra ``gnnfuse[reorder]``).
- ``"community"``: a cluster order in torch ops (CPU and GPU): a few propagation steps of random vectors
  (:func:`cluster_embedding`, one ``fused_gather_scatter`` each) contract every community to a point,
  and a Z-order curve through those points (:func:`zorder`) puts each community's nodes in one id
  range. Linear in the edges, one sort of the nodes: it scales to products-sized graphs.
- ``"community-refined"``: ``"community"``, then :data:`REFINE_ROUNDS` rounds of majority voting
  (:func:`refine_blocks`): the order is cut into blocks of :data:`REFINE_BLOCK` nodes and every node
  moves to the block most of its in-neighbours are in, which reunites communities the curve cut in
  two. Each round is one pass over every row's first :data:`REFINE_VOTES` in-edges (C++ on CPU, a
  Triton kernel on GPU; no sort of the edges).
- ``"identity"``: ``arange(num_nodes)``.
- ``"auto"``: see :func:`choose_method`.

A reorder relabels one node set, so it needs a square graph: for a bipartite ``num_nodes=(num_src,
num_dst)`` with different sizes it raises ``ValueError`` (the sources and the targets are different
nodes; reorder each side's own graph, or the graph before it was split).
"""
from __future__ import annotations

import torch

from ._validate import require_choice
from .constants import INT32_MAX
from .csr import CSR, check_edge_index
from .locality import locality_stats

METHODS = ("auto", "identity", "degree", "rcm", "metis", "community", "community-refined")
PART_NODES = 1024  # METIS part size: a part's rows of F = 128 fp32 features (512 KB) stay in L2
EMBED_DIM, EMBED_STEPS, ZORDER_BITS = 8, 8, 7  # "community": 8 coordinates, 8 steps, 7 levels (56-bit keys)
AUTO_MIN_NODES = 65_536  # "auto": below this the whole feature matrix stays in cache, reordering gains nothing
AUTO_LOCAL_ENOUGH = 0.5  # "auto": keep the order when windows already read < this share of the random case's rows
# "community-refined": nodes per voting block, rounds of voting, votes per node (a row's first in-edges).
# Measured on community-1m (scrambled; distinct rows/edge: generated order 0.36, "community" 0.50):
# blocks of 512 nodes, 3 rounds of 16 votes 0.39 (2 rounds: 0.44 with 16 or 32 votes, 0.42 with 64 or
# all; 3 rounds of 8 votes 0.50, of 32 or 64 0.40; blocks of 2048 0.44, of 256 with 3 rounds 0.64);
# 12-16 propagation steps instead of 8 gave no gain (0.50).
REFINE_BLOCK, REFINE_ROUNDS, REFINE_VOTES = 512, 3, 16
MAX_VOTES = 64  # the C++ vote's per-row buffer


def reorder(edge_index: torch.Tensor, num_nodes: int | tuple[int, int] | None = None, method: str = "auto", *,
            seed: int = 0) -> torch.Tensor:
    """A permutation ``perm`` (``perm[new_id] = old_id``, see the module docstring) that puts nodes
    whose edges connect them next to each other. ``num_nodes`` defaults to ``max(edge_index) + 1``;
    ``seed`` fixes the community method's random choices. The input is not modified.

    Example::

        perm = gnnfuse.reorder(edge_index, num_nodes=x.size(0))      # method="auto"
        x_new, ei_new = x[perm], gnnfuse.ordering.relabel(edge_index, perm)
        out = gnnfuse.ordering.unpermute(model(x_new, ei_new), perm)  # rows back in the old ids
    """
    check_edge_index(edge_index)
    require_choice("method", method, METHODS)
    n = _square_size(edge_index, num_nodes)
    device = edge_index.device
    if n == 0 or method == "identity":
        return torch.arange(n, device=device)
    if method == "auto":
        if n < AUTO_MIN_NODES:  # choose_method's first rule, before paying for a CSR
            return torch.arange(n, device=device)
        csr = CSR.from_edge_index(edge_index, n)
        method = choose_method(csr)
        if method == "identity":
            return torch.arange(n, device=device)
        if method in ("community", "community-refined"):
            return _community(csr, seed, refined=method == "community-refined")
    if method == "degree":
        deg = torch.bincount(edge_index[0].long(), minlength=n) + torch.bincount(edge_index[1].long(), minlength=n)
        return torch.sort(deg, descending=True, stable=True).indices
    if method == "rcm":
        from scipy.sparse.csgraph import reverse_cuthill_mckee

        perm = reverse_cuthill_mckee(_symmetric_scipy(edge_index, n), symmetric_mode=True)
        return torch.from_numpy(perm.astype("int64")).to(device)
    if method == "metis":
        return _metis(edge_index, n).to(device)
    return _community(CSR.from_edge_index(edge_index, n), seed, refined=method == "community-refined")


def choose_method(csr: CSR) -> str:
    """What ``method="auto"`` runs, from the graph's size and its current locality:

    - ``"identity"`` when the graph is small (fewer than ``AUTO_MIN_NODES`` nodes: its features stay in
      cache whatever the order) or its order is already local (a window of consecutive targets reads
      fewer than ``AUTO_LOCAL_ENOUGH`` times the distinct rows random ids would:
      :func:`gnnfuse.locality.locality_stats`);
    - otherwise ``"community-refined"``, on CPU and GPU: its voting rounds (one pass over each row's
      first in-edges, no sort) cost little next to the propagation steps, and the locality they add
      pays for them. (H100, community-products F=128: 40 ms against ``"community"``'s 36 ms, forward
      4.6 against 5.1 ms, break-even after 2.5 GCN epochs against 2.6; 2-core CPU, community-1m: 2.5
      epochs against 4.2; benchmarks/results/reorder_*_2026-11-23_cost.md.)
    """
    if csr.num_dst < AUTO_MIN_NODES:
        return "identity"
    stats = locality_stats(csr)
    if stats.distinct_fraction < AUTO_LOCAL_ENOUGH * stats.random_fraction:
        return "identity"
    return "community-refined"


# ---- applying and undoing a permutation ------------------------------------------------------------
def inverse(perm: torch.Tensor) -> torch.Tensor:
    """``inv`` with ``inv[old_id] = new_id``."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device, dtype=perm.dtype)
    return inv


def relabel(edge_index: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """edge_index in the new ids (same dtype and edge order): ``inverse(perm)[edge_index]``."""
    check_edge_index(edge_index)
    flat = edge_index.as_subclass(torch.Tensor).reshape(-1)  # one index_select: 2-3x faster than [edge_index] on CPU
    return inverse(perm).to(edge_index.dtype).index_select(0, flat).view(edge_index.shape)


def unpermute(out: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Node-level rows computed on the reordered graph, back in the original ids."""
    return out[inverse(perm)]


# ---- methods -------------------------------------------------------------------------------------------
def _square_size(edge_index: torch.Tensor, num_nodes) -> int:
    if isinstance(num_nodes, tuple):
        if len(num_nodes) != 2 or num_nodes[0] != num_nodes[1]:
            raise ValueError(
                f"reorder relabels one node set; num_nodes={num_nodes!r} describes a bipartite graph whose "
                "sources and targets are different nodes. Reorder each node set's own graph instead.")
        num_nodes = num_nodes[0]
    if num_nodes is None:
        return int(edge_index.max()) + 1 if edge_index.numel() else 0
    if num_nodes < 0:
        raise ValueError(f"num_nodes must be >= 0; got {num_nodes}")
    if edge_index.numel() and int(edge_index.max()) >= num_nodes:
        raise ValueError(f"edge_index has node ids >= num_nodes={num_nodes}")
    return int(num_nodes)


def _symmetric_scipy(edge_index: torch.Tensor, n: int):
    """A + A^T without self loops or duplicates, as scipy CSR (what RCM and METIS take)."""
    import numpy as np
    import scipy.sparse

    ei = edge_index.long().cpu().numpy()
    keep = ei[0] != ei[1]
    rows, cols = np.concatenate([ei[0][keep], ei[1][keep]]), np.concatenate([ei[1][keep], ei[0][keep]])
    a = scipy.sparse.csr_matrix((np.ones(rows.size, dtype=np.int8), (rows, cols)), shape=(n, n))
    a.sum_duplicates()
    return a


def _metis(edge_index: torch.Tensor, n: int) -> torch.Tensor:
    try:
        import pymetis
    except ImportError as e:
        raise ImportError('reorder(method="metis") needs pymetis: pip install "gnnfuse[reorder]" '
                          '(or pip install pymetis)') from e
    parts = max(1, -(-n // PART_NODES))
    if parts == 1:
        return torch.arange(n)
    a = _symmetric_scipy(edge_index, n)
    _, membership = pymetis.part_graph(parts, xadj=a.indptr, adjncy=a.indices)
    return torch.sort(torch.as_tensor(membership, dtype=torch.int64), stable=True).indices


def _community(csr: CSR, seed: int, refined: bool = False) -> torch.Tensor:
    """Nodes ordered along a Z-order curve through their :func:`cluster_embedding` (then refined)."""
    perm = zorder(cluster_embedding(csr, seed=seed))
    return refine_blocks(csr, perm) if refined else perm


def refine_blocks(csr: CSR, perm: torch.Tensor, *, block: int = REFINE_BLOCK, rounds: int = REFINE_ROUNDS,
                  votes: int = REFINE_VOTES) -> torch.Tensor:
    """``perm`` regrouped by majority vote: nodes are labelled by their block of ``block`` consecutive
    positions; each round every node takes the label most of its first ``votes`` in-neighbours (in
    CSR order) carry (ties: the highest label; nodes without in-edges keep theirs). The result
    orders nodes by final label, keeping ``perm``'s order within a label. Deterministic, and the
    same labels on CPU (a C++ pass over the rows), on GPU (a Triton kernel, gnnfuse/triton/vote.py) and
    in torch ops (:func:`_vote_torch`, the fallback): no sort of the edges."""
    n = csr.num_dst
    if n == 0 or csr.num_edges == 0:
        return perm
    if not 1 <= votes <= MAX_VOTES:
        raise ValueError(f"votes must be in 1..{MAX_VOTES}; got {votes}")
    rank = inverse(perm)
    label = rank // block
    vote = _vote_function(csr, votes, labels=-(-n // block))
    for _ in range(rounds):
        label = vote(label)
    return torch.sort(label * n + rank).indices


def _vote_function(csr: CSR, votes: int, labels: int):
    """label -> the next round's label (see :func:`refine_blocks`); labels lie in ``[0, labels)``."""
    rowptr, col = csr.rowptr.contiguous(), csr.col.contiguous()
    if csr.device.type == "cuda":
        from .triton.vote import majority_vote

        return lambda label: majority_vote(rowptr, col, label, votes, labels)
    ext = _reorder_extension()
    if ext is not None:
        return lambda label: ext.majority_vote(rowptr, col, label, votes)
    return _vote_torch(csr, votes, labels)


def _reorder_extension():
    from ._build import optional_extension

    return optional_extension("reorder", "reorder helper unavailable, voting with torch ops", stacklevel=4)


def _first_in_edges(csr: CSR, k: int) -> torch.Tensor:
    """[num_dst, k]: each row's first ``k`` in-neighbours (sources), in CSR order. A row with fewer
    has padding ids past every node in its free slots: ``num_src + j`` in slot ``j``, so a table of
    ``num_src + k`` rows (the nodes, then one row per slot) answers every entry with one gather."""
    rowptr, col = csr.rowptr.long(), csr.col
    slot = torch.arange(k, device=col.device)
    pos = (rowptr[:-1, None] + slot).clamp_(max=max(csr.num_edges - 1, 0))
    dtype = col.dtype if csr.num_src + k <= INT32_MAX else torch.int64
    present = slot < (rowptr[1:] - rowptr[:-1])[:, None]
    return torch.where(present, col[pos].to(dtype), (csr.num_src + slot).to(dtype))


def _vote_torch(csr: CSR, votes: int, labels: int):
    """The majority vote in torch ops (CPU without the C++ helper; the tests' reference), for labels
    in ``[0, labels)``: each row's first ``votes`` in-neighbours' labels as a [rows, votes] matrix
    (padding slot ``j`` votes ``-1 - j``: distinct, negative), sorted along the row; a label's count
    is the length of its run (two binary searches of the sorted row), and the best vote maximises
    ``(count - 1) * labels + label`` (ties: the highest label); a padding vote scores below zero, so
    a row with none but padding keeps its label. Integer ops only, [rows, votes] tensors (no
    [rows, votes, votes] comparison: 3.4x faster on CPU at 250K rows)."""
    src = _first_in_edges(csr, votes)
    narrow = votes * labels <= INT32_MAX and csr.num_src < INT32_MAX  # int32 scores: half the traffic
    dtype = torch.int32 if narrow else torch.int64
    padding = -1 - torch.arange(votes, device=src.device, dtype=dtype)

    def vote(label: torch.Tensor) -> torch.Tensor:
        lab = torch.cat([label.to(dtype), padding])[src]
        s = lab.sort(dim=1).values
        count = torch.searchsorted(s, s, right=True, out_int32=narrow) - torch.searchsorted(s, s, out_int32=narrow)
        best = count.sub_(1).mul_(labels).add_(s).amax(1)
        return torch.where(best >= 0, best % labels, label)

    return vote


def cluster_embedding(csr: CSR, *, dim: int = EMBED_DIM, steps: int = EMBED_STEPS, seed: int = 0) -> torch.Tensor:
    """[num_nodes, dim] float32 coordinates in which nodes of one community lie close together.

    Random vectors averaged ``steps`` times over each node and its in-neighbours (the power iteration
    of spectral clustering): inside a community the average mixes within a few steps, across
    communities only through the few edges between them, so each community contracts to its own
    point. Each step is one ``fused_gather_scatter`` (linear in the edges, on CPU or GPU). The
    average keeps constants and shrinks nothing else to zero in a few steps, so the coordinates are
    centred and scaled once, at the end (that commutes with the steps). Nodes without in-edges take
    the coordinates of one node they point to.
    """
    from .ops.gather_scatter import fused_gather_scatter

    n, device = csr.num_dst, csr.device
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(n, dim, generator=g, device=device)
    if csr.num_edges == 0:
        return x
    scale = 1.0 / (csr.in_degree().float() + 1.0)[:, None]
    for _ in range(steps):
        x = fused_gather_scatter(x, csr, "sum").add_(x).mul_(scale)
    x -= x.mean(0)
    x /= x.std(0).clamp_(min=1e-30)
    no_in = csr.in_degree() == 0
    if bool(no_in.any()):  # (checked on the nodes first: the edge-level gathers below cost a pass over E)
        col = csr.col.long()
        orphans = no_in[col]  # edges out of nodes without in-edges
        x[col[orphans]] = x[csr.row().long()[orphans]]
    return x


def zorder(x: torch.Tensor, bits: int = ZORDER_BITS) -> torch.Tensor:
    """Indices sorting the rows of ``x`` [n, d] (standardised coordinates) along a Z-order
    (Morton) curve: ``bits`` levels per dimension (``bits * d <= 63``), so points close in every
    coordinate get close ranks and a tight cluster a contiguous range."""
    n, dim = x.shape
    if bits * dim > 63:
        raise ValueError(f"zorder: bits * dim must be <= 63; got {bits} * {dim}")
    # [dim, n] cells: every step below runs on contiguous rows
    q = ((x.t().clamp(-3.0, 3.0) + 3.0) * ((1 << bits) / 6.0)).long().clamp_(max=(1 << bits) - 1).contiguous()
    # spread[v]: v's bits moved to every dim-th position (bit b -> b * dim): a 2**bits-entry table
    levels = torch.arange(1 << bits, device=x.device)
    spread = torch.zeros_like(levels)
    for b in range(bits):
        spread |= ((levels >> b) & 1) << (b * dim)
    key = torch.zeros(n, dtype=torch.int64, device=x.device)
    for j in range(dim):  # level-major interleave, dimension 0 most significant within a level
        key |= spread[q[j]] << (dim - 1 - j)
    return torch.sort(key, stable=True).indices
