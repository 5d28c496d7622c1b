# SPDX-License-Identifier: MIT
"""Training data from a fixed random first-order Markov source.

The source is a V x V transition matrix drawn once from a seeded generator
(each row a sparse-ish Dirichlet draw, so the next token is predictable but
not certain). Sequences start in the stationary distribution, so every
predicted token has conditional entropy equal to the source's entropy rate

    H = - sum_i pi_i sum_j P_ij ln P_ij      (nats/token)

which is the lowest cross-entropy any model can reach: the loss floor.

Batches are a pure function of (seed, step): every data-parallel size and
every resume sees the same global batch at the same step. Rank r takes rows
[r*B/dp, (r+1)*B/dp) of the global batch.
"""
from __future__ import annotations

import math

import torch


class MarkovSource:
    def __init__(self, vocab: int, seed: int, alpha: float = 0.03):
        g = torch.Generator().manual_seed(seed)
        # Dirichlet(alpha) rows via normalised Gamma draws; float64 for the entropy.
        conc = torch.full((vocab, vocab), alpha, dtype=torch.float64)
        gam = _gamma(conc, g) + 1e-12
        self.P = gam / gam.sum(dim=1, keepdim=True)
        self.vocab = vocab
        self.seed = seed
        self.pi = _stationary(self.P)
        logp = torch.where(self.P > 0, self.P.log(), torch.zeros_like(self.P))
        self.entropy_rate = float(-(self.pi[:, None] * self.P * logp).sum())
        self.cdf = torch.cumsum(self.P, dim=1).to(torch.float64)
        self.cdf[:, -1] = 1.0
        self.pi_cdf = torch.cumsum(self.pi, dim=0)
        self.pi_cdf[-1] = 1.0

    def batch(self, step: int, batch: int, seq: int) -> torch.Tensor:
        """[batch, seq+1] int64 tokens of global step `step` (CPU)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + 7919 * step + 1)
        u = torch.rand((seq + 1, batch), generator=g, dtype=torch.float64)
        out = torch.empty((seq + 1, batch), dtype=torch.int64)
        cur = torch.searchsorted(self.pi_cdf, u[0]).clamp_(max=self.vocab - 1)
        out[0] = cur
        for t in range(1, seq + 1):
            rows = self.cdf[cur]
            cur = torch.searchsorted(rows, u[t].unsqueeze(1)).squeeze(1).clamp_(max=self.vocab - 1)
            out[t] = cur
        return out.t().contiguous()


def _gamma(conc: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Gamma(alpha < 1) draws from a seeded generator (Marsaglia-Tsang on
    alpha+1, then the u^(1/alpha) boost), vectorised with a fixed number of
    rounds so the result depends only on the seed."""
    a = conc + 1.0
    d = a - 1.0 / 3.0
    c = 1.0 / torch.sqrt(9.0 * d)
    out = torch.zeros_like(conc)
    done = torch.zeros_like(conc, dtype=torch.bool)
    for _ in range(64):
        x = torch.randn(conc.shape, generator=g, dtype=torch.float64)
        u = torch.rand(conc.shape, generator=g, dtype=torch.float64)
        v = (1.0 + c * x) ** 3
        ok = (v > 0) & (torch.log(u.clamp_min(1e-300)) < 0.5 * x * x + d - d * v + d * torch.log(v.clamp_min(1e-300)))
        take = ok & ~done
        out = torch.where(take, d * v, out)
        done = done | ok
        if bool(done.all()):
            break
    out = torch.where(done, out, d)  # practically never
    u = torch.rand(conc.shape, generator=g, dtype=torch.float64)
    return out * u.clamp_min(1e-300) ** (1.0 / conc)


def _stationary(P: torch.Tensor) -> torch.Tensor:
    pi = torch.full((P.shape[0],), 1.0 / P.shape[0], dtype=torch.float64)
    for _ in range(10_000):
        nxt = pi @ P
        if float((nxt - pi).abs().sum()) < 1e-15:
            pi = nxt
            break
        pi = nxt
    return pi / pi.sum()


def unigram_entropy(src: MarkovSource) -> float:
    p = src.pi
    return float(-(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum())


if __name__ == "__main__":
    s = MarkovSource(256, seed=1234)
    print(f"entropy rate {s.entropy_rate:.4f} nats/token, unigram {unigram_entropy(s):.4f}, "
          f"uniform {math.log(256):.4f}")
    b = s.batch(0, 4, 16)
    print(b)
