"""Pins what one training step of each fused attention layer launches (Triton backend), so that the
count does not creep back: on small graphs the step is bound by the host, where every launch and
every autograd node costs more than the kernels (benchmarks/results/attention-profile_*).

Counted by benchmarks/count_attention_launches.py (profiler events of the torch ops that launch a
kernel, plus the Triton launches; the step's loss, a mean of squares, is included). Triton launches
are pinned exactly; torch launches as an upper bound (a torch release may implement an op with
fewer). A lower count after a change is welcome: lower the bound here with it."""
import pytest

from benchmarks.count_attention_launches import count_step

# layer -> {phase: (Triton launches, at most this many torch launches)}
EXPECTED = {
    "GATConv": {"forward": (1, 8), "backward": (2, 9)},
    "GATv2Conv": {"forward": (1, 5), "backward": (2, 11)},
    "TransformerConv": {"forward": (1, 7), "backward": (2, 13)},
}


@pytest.mark.parametrize("layer", sorted(EXPECTED))
def test_training_step_launch_count(layer):
    counts = count_step(layer, heads=2, width=4, nodes=10)
    for phase, (triton_launches, torch_bound) in EXPECTED[layer].items():
        launches, _host = counts[phase]
        triton = sum(c for name, c in launches.items() if name.startswith("triton::"))
        torch_launches = {name: c for name, c in launches.items() if not name.startswith("triton::")}
        assert triton == triton_launches, (phase, dict(launches))
        assert sum(torch_launches.values()) <= torch_bound, (phase, torch_launches)


def test_bound_launches_hand_the_launcher_addresses():
    """A bound launch passes tensors as their data pointers (Triton's launcher then skips its own
    data_ptr call and driver query per pointer); other arguments pass unchanged."""
    import torch

    from gnnfuse.triton._launch import addresses

    x, y = torch.zeros(3), torch.nn.Parameter(torch.ones(2))
    assert addresses((x, 7, 0.5, None, True, y)) == [x.data_ptr(), 7, 0.5, None, True, y.data_ptr()]


def _attention_calls(kind, device, dropout):
    """Forward output and every input's gradient of one fused attention call (seeded dropout)."""
    import torch

    import gnnfuse
    from gnnfuse.testing import random_graph

    g = torch.Generator().manual_seed(5)
    n, heads, width = (300, 4, 8) if device == "cuda" else (12, 2, 4)
    ei = random_graph(n, n, 8 * n, seed=4).to(device)
    x, q, att = (torch.randn(n, heads, width, generator=g).to(device).requires_grad_() for _ in range(3))
    a_src, a_dst = (torch.randn(n, heads, generator=g).to(device).requires_grad_() for _ in range(2))
    if kind == "gat":
        out = gnnfuse.gat_attention(x, a_src, a_dst, ei, add_self_loops=True, dropout=dropout, seed=11)
        inputs = (x, a_src, a_dst)
    elif kind == "gatv2":
        out = gnnfuse.gatv2_attention(x, q, att[0], ei, add_self_loops=True, dropout=dropout, seed=11)
        inputs = (x, q, att)
    else:
        out = gnnfuse.dot_attention(q, x, att, ei, dropout=dropout, seed=11)
        inputs = (q, x, att)
    grads = torch.autograd.grad(out, inputs, torch.randn(out.shape, generator=g).to(device), allow_unused=True)
    return (out.detach(), *(gr for gr in grads if gr is not None))


@pytest.mark.parametrize("kind", ["gat", "gatv2", "dot"])
def test_attention_setups_bound_and_plain_agree_bitwise(kind, monkeypatch):
    """The attention kernels' cached setups (gnnfuse/triton/attention_launches.py): the first call
    binds the launches, the next ones reuse them; both, and Triton's plain launch path, give the
    same bits. On the CPU CI (interpreter) every path is the plain one: the check is of the setups'
    reuse across calls there."""
    import torch

    from gnnfuse.triton import _launch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    runs = [_attention_calls(kind, device, 0.3) for _ in range(3 if device == "cuda" else 2)]
    with monkeypatch.context() as m:
        m.setattr(_launch, "_ENABLED", False)
        runs.append(_attention_calls(kind, device, 0.3))
    for run in runs[1:]:
        assert len(run) == len(runs[0]) and all(torch.equal(a, b) for a, b in zip(runs[0], run))
