"""DistributedDataParallel with the captured training step (gnnfuse.loader.CapturedStep) on one GPU:
PyTorch's recipe for capturing a whole DDP step -- DDP built, warmed up and captured on one side
stream -- leaves autograd no "AccumulateGrad stream mismatch" to warn about; warming up and
capturing on another stream than DDP's does (the control: the warning names the cause)."""
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("torch_geometric")

ROOT = Path(__file__).resolve().parents[1]

# One process, one rank of NCCL. The warning is a TORCH_WARN_ONCE: each case needs a fresh process.
SCRIPT = r"""
import json, os, sys, warnings
import torch, torch.distributed as dist, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from gnnfuse.loader import CapturedStep, HopPadding, NeighborSampler, layer_csrs, layer_sizes
from gnnfuse.nn import SAGEConv

same_stream = sys.argv[1] == "same"
os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
torch.manual_seed(0)
n = 2000
edge_index = torch.randint(0, n, (2, 20000), device="cuda")
x, y = torch.randn(n, 8, device="cuda"), torch.randint(0, 3, (n,), device="cuda")
sampler = NeighborSampler(edge_index, [4, 3], num_nodes=n, seed=0, device="cuda")
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = torch.nn.ModuleList([SAGEConv(8, 16), SAGEConv(16, 3)])

    def forward(self, h, graphs, sizes):
        for i, (conv, g, (d, s, _)) in enumerate(zip(self.convs, graphs, sizes)):
            h = conv((h, h[:d]), g, size=(s, d))
            h = h.relu() if i == 0 else h
        return h

model = Net().cuda()
side = torch.cuda.Stream()
with torch.cuda.stream(side):  # DDP built on a side stream (torch.cuda.graphs' DDP notes)
    ddp = DistributedDataParallel(model)
torch.cuda.current_stream().wait_stream(side)
optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01, capturable=True)

def step(xb, yb, ei, nodes, edges):
    optimizer.zero_grad(set_to_none=True)
    graphs = layer_csrs(edge_index=ei, num_sampled_nodes=nodes, num_sampled_edges=edges)
    loss = F.cross_entropy(ddp(xb, graphs, layer_sizes(nodes, edges)), yb)
    loss.backward()
    optimizer.step()
    return loss.detach()

captured = CapturedStep(step, x, warmup=11, stream=side if same_stream else None, padding=HopPadding(margin=0.5))
losses = []
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for i in range(14):
        seeds = torch.randperm(n, device="cuda")[:64]
        out = sampler.sample(seeds)
        losses.append(captured(out.node, torch.stack([out.row, out.col]), out.num_sampled_nodes,
                               out.num_sampled_edges, y[seeds]))
    torch.cuda.synchronize()
print(json.dumps(dict(captures=captured.captures, capture=captured.capture,
                      losses=[float(v) for v in losses],
                      warnings=[str(w.message)[:200] for w in caught])))
dist.destroy_process_group()
"""


def _start(case: str) -> subprocess.Popen:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0])
    return subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", SCRIPT, case], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:  # a hang: every thread's stack (faulthandler) into the failure
        proc.send_signal(signal.SIGABRT)
        out, err = proc.communicate()
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ddp_captured_step_on_ddps_stream_has_no_accumulate_grad_stream_mismatch():
    has_warning = hasattr(torch.autograd.graph, "set_warn_on_accumulate_grad_stream_mismatch")
    procs = {case: _start(case) for case in (("same", "other") if has_warning else ("same",))}  # at once
    results = {case: _result(proc) for case, proc in procs.items()}
    fixed = results["same"]
    assert fixed["capture"] and fixed["captures"] >= 1
    assert not [w for w in fixed["warnings"] if "AccumulateGrad" in w], fixed["warnings"]
    if has_warning:  # the control: warm-up and capture on another stream than DDP's
        assert [w for w in results["other"]["warnings"] if "AccumulateGrad" in w], results["other"]["warnings"]
