"""A plain, hook-free Sprout: the reference the benchmarks measure the hooked model against.

Written here from the chapter's equations with model.py's module names, so a state dict moves between
it and `sprout.Sprout` unchanged. No hook points, no checks: the fastest honest implementation.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class PlainRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x.float(), (x.size(-1),), self.weight.float(), self.eps).type_as(x)


def rotate(x, cos, sin):
    """x: (B, H, T, d_head); rotate (x_i, x_{i+d/2}) by position * theta_i."""
    half = x.size(-1) // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


class PlainAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.d_head = cfg.n_head, cfg.d_model // cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.q_norm = PlainRMSNorm(self.d_head)
        self.k_norm = PlainRMSNorm(self.d_head)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, self.d_head).transpose(1, 2) for t in self.qkv(x).split(C, dim=-1))
        q, k = rotate(self.q_norm(q), cos, sin), rotate(self.k_norm(k), cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class PlainFeedForward(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w3 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class PlainBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm1 = PlainRMSNorm(cfg.d_model)
        self.attn = PlainAttention(cfg)
        self.norm2 = PlainRMSNorm(cfg.d_model)
        self.ffn = PlainFeedForward(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.ffn(self.norm2(x))


class PlainSprout(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(PlainBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = PlainRMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.embed.weight
        d_head = cfg.d_model // cfg.n_head
        inv_freq = 1.0 / (cfg.rope_base ** (torch.arange(0, d_head, 2).float() / d_head))
        angles = torch.outer(torch.arange(cfg.context).float(), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
        for name, p in self.named_parameters():
            if name.endswith(("proj.weight", "w2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))

    def forward(self, idx, targets=None):
        T = idx.size(1)
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x, self.cos[:T], self.sin[:T])
        logits = self.head(self.norm(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
