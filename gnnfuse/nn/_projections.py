"""GATConv's dense projections as one autograd node with its own backward.

On small graphs a training step of an attention layer is bound by the host: every torch op costs a
launch and every autograd node its share of the engine's work, both more than the kernels
themselves (benchmarks/results/attention-profile_*). GATConv's projection and its two folded
attention terms are a handful of small products that autograd would run as ~20 nodes (a linear is
a product, a transpose and a view node; an einsum a dozen permute/reshape nodes around one batched
product); here they are one node whose forward and backward issue as few launches as the maths
needs. (GATv2Conv's and TransformerConv's linears stay PyG's own: stacking them into one batched
product of an expanded input measured slower on an H100, the expanded input being copied:
benchmarks/results/attention_gatconv-gatv2conv-transformerconv_h100_2026-11-23_attgpu-*.md.)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn.dense.linear import Linear as PygLinear


class GATProjection(torch.autograd.Function):
    """PyG's default GATConv projection and both attention terms over one input, as one autograd
    node with its own backward: ``(h, a_src, a_dst) = (x @ W.T, x @ w[:, 0].T, x @ w[:, 1].T)``
    with ``w [H, 2, in]`` folded from the bias-free weight ``W [H * C, in]`` and ``att_src`` /
    ``att_dst`` ``[1, H, C]`` in one batched product (``attention_logits``' fold, both roles at
    once). Through autograd, a linear and two einsums + linears cost ~20 nodes and 12 launches a
    training step (forward and backward); this is 5 forward and 5 backward, where the weight's two
    gradients (the projection's and the fold's) meet in one addmm."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, att_src: Tensor, att_dst: Tensor):
        h, a_src, a_dst, att, w = project(x, weight, att_src, att_dst)
        ctx.save_for_backward(x, weight, att, w)
        return h, a_src, a_dst

    @staticmethod
    def backward(ctx, g_h: Tensor | None, g_src: Tensor | None, g_dst: Tensor | None):
        x, weight, att, w = ctx.saved_tensors
        return project_backward(x, weight, att, w, g_h, g_src, g_dst, ctx.needs_input_grad)


# (F.linear: on 2-D inputs without a bias torch's own mm(x, weight.T), the same product, its transpose
# made in C++; and as few Python-level ops as the shapes allow: on a small graph each costs host time
# every step)
def project(x: Tensor, weight: Tensor, att_src: Tensor, att_dst: Tensor):
    """GATProjection's forward: (h [N, H * C], a_src [N, H], a_dst [N, H], att [H, 2, C], w [H, 2, in])."""
    H, C = att_src.shape[-2], att_src.shape[-1]
    att = torch.stack((att_src, att_dst), -2).view(H, 2, C)
    w = torch.bmm(att, weight.view(H, C, -1))
    w_src, w_dst = w.unbind(1)
    return F.linear(x, weight), F.linear(x, w_src), F.linear(x, w_dst), att, w


def project_backward(x, weight, att, w, g_h: Tensor | None, g_src: Tensor | None, g_dst: Tensor | None, needs):
    """GATProjection's backward: the gradients of (x, weight, att_src, att_dst), None where ``needs``
    (four flags) says none is wanted."""
    H, _, C = att.shape
    n = x.shape[0]
    g_src = g_src if g_src is not None else x.new_zeros(n, H)
    g_dst = g_dst if g_dst is not None else x.new_zeros(n, H)
    g = torch.stack((g_src, g_dst), 2).view(n, 2 * H)  # columns in w's (head, role) order
    need_x, need_w, need_src, need_dst = needs
    g_x = g_weight = g_att_src = g_att_dst = None
    if need_x:
        w2 = w.view(2 * H, -1)
        g_x = torch.mm(g, w2) if g_h is None else torch.addmm(torch.mm(g, w2), g_h, weight)
    if need_w or need_src or need_dst:
        g_w = torch.mm(g.t(), x).view(H, 2, -1)  # [H, 2, in]
        if need_w:
            g_weight = torch.bmm(att.transpose(1, 2), g_w).view(weight.shape)
            if g_h is not None:
                g_weight = torch.addmm(g_weight, g_h.t(), x)
        if need_src or need_dst:
            g_att = torch.bmm(g_w, weight.view(H, C, -1).transpose(1, 2)).view(1, H, 2, C)
            g_att_src, g_att_dst = g_att.unbind(2)  # [1, H, C] each
    return g_x, g_weight, g_att_src, g_att_dst


_PLAIN_WEIGHTS = (torch.nn.Parameter, Tensor)


def linear_params(lin) -> tuple[Tensor, Tensor | None] | None:
    """``(lin.weight, lin.bias)`` where ``lin`` is a plain, initialised linear layer without hooks (its
    forward is ``F.linear(x, weight, bias)``, so a fused product may stand in for it), else None. The
    parameters are read from the module's registry (:func:`param`): the one-node routes read six to
    eight of them a call on a host-bound step."""
    if type(lin) not in (PygLinear, torch.nn.Linear) or lin._forward_hooks or lin._forward_pre_hooks:
        return None
    weight = param(lin, "weight")
    if type(weight) not in _PLAIN_WEIGHTS and (  # (the common case, without Parameter's metaclass isinstance)
            not isinstance(weight, Tensor) or isinstance(weight, torch.nn.parameter.UninitializedParameter)):
        return None
    return weight, param(lin, "bias")


def submodule(module, name: str):
    """``getattr(module, name)`` for a registered submodule, read from the registry (``_modules``)
    without ``Module.__getattr__``'s fallback lookup; other attributes (PyG registers an absent
    linear as a None parameter) through getattr."""
    modules = module._modules
    return modules[name] if name in modules else getattr(module, name)


def param(module, name: str):
    """``getattr(module, name)`` for a registered parameter (or a None one), read from the registry
    (``_parameters``) without ``Module.__getattr__``'s fallback lookup; anything else through getattr."""
    params = module._parameters
    return params[name] if name in params else getattr(module, name)
