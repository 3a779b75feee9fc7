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
    "GATConv": {"forward": (1, 8), "backward": (2, 12)},
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
