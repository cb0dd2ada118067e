"""Small recurrences in the syntactic forms users write, and near misses the pass must not touch."""
import torch
from torch import nn


class Recurrence(nn.Module):
    """``h_t = step(h_{t-1}, t)`` over axis ``axis`` of x; ``form`` picks how the step is written
    and ``out`` what is returned (all states stacked, the last state, or an intermediate)."""

    def __init__(self, form="a*h+b", axis=1, reverse=False, init="zeros", out="stack", channels=6):
        super().__init__()
        self.form, self.axis, self.reverse, self.init, self.out = form, axis, reverse, init, out
        self.decay = nn.Parameter(torch.rand(channels) * 0.9)

    def step(self, h, x, g, t):
        xt, gt = x.select(self.axis, t), g.select(self.axis, t)
        f = self.form
        if f == "a*h+b":
            return gt * h + xt
        if f == "b+h*a":
            return xt + h * gt
        if f == "decay":                       # loop-invariant coefficient, b = c*x
            return self.decay * h + (1 - self.decay) * xt
        if f == "h+x":                         # cumulative sum
            return h + xt
        if f == "tanh":                        # near miss: not affine in h
            return torch.tanh(gt * h + xt)
        if f == "h*h":                         # near miss: coefficient depends on h
            return h * h * 0.1 + xt
        raise ValueError(f)

    def forward(self, x, g, h0):
        n = x.shape[self.axis]
        steps = list(range(n))[::-1] if self.reverse else list(range(n))
        if self.init == "zeros":
            h = torch.zeros_like(h0)
        elif self.init == "input":
            h = h0
        if self.init == "first":               # h_0 = b_0
            h, steps = x.select(self.axis, steps[0]), steps[1:]
            outs = [h]
        else:
            outs = []
        for t in steps:
            h = self.step(h, x, g, t)
            outs.append(h)
        if self.reverse:
            outs = outs[::-1]
        if self.out == "last":
            return h
        if self.out == "middle":               # an intermediate state used elsewhere
            return torch.stack(outs, self.axis), outs[len(outs) // 2] * 2.0
        return torch.stack(outs, self.axis)


def inputs(axis=1, length=7, batch=2, channels=6, seed=0):
    """x, g (gates in (0, 1)) with L at ``axis`` and h0, as float32 tensors."""
    torch.manual_seed(seed)
    shape = [batch, channels]
    shape.insert(axis, length)
    return torch.randn(*shape), torch.rand(*shape), torch.randn(batch, channels)
