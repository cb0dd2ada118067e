"""Ranking training of the latent-dynamics network on measured records, grouped by task.

Within a task, for every pair of records with different latencies the faster one should score
higher (logistic pairwise loss, weighted by how different they are); a small centred
regression on ``-log(latency)`` keeps the score's scale meaningful (the search samples parents
in proportion to ``exp(score)``).  Tasks are never compared with each other.
"""
import numpy as np
import torch

from .featurize import pad


class Group:
    """One task's records as tensors: state, hardware, padded actions, log-latencies."""

    def __init__(self, state, hw, action_list, secs):
        self.n = len(action_list)
        self.state = torch.as_tensor(np.asarray(state, np.float32)).expand(self.n, -1)
        self.hw = torch.as_tensor(np.asarray(hw, np.float32)).expand(self.n, -1)
        self.actions, self.mask = pad(action_list)
        self.target = torch.as_tensor(-np.log(np.asarray(secs, np.float64)), dtype=torch.float32)


def ranking_loss(scores, target):
    diff_t = target[:, None] - target[None, :]
    diff_s = scores[:, None] - scores[None, :]
    pairs = diff_t > 0.02                      # i clearly faster than j
    weight = diff_t.clamp(max=2.0)[pairs]
    pair_loss = (torch.nn.functional.softplus(-diff_s[pairs]) * weight).sum() / weight.sum().clamp(min=1e-6)
    centred = (scores - scores.mean()) - (target - target.mean())
    return pair_loss + 0.25 * (centred ** 2).mean()


def fit(net, groups, norm, steps, lr=3e-3, batch=64, seed=0, weight_decay=1e-4):
    """Adam on random (task, record subset) batches; returns the last 20 steps' mean loss."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    groups = [g for g in groups if g.n >= 2]
    if not groups:
        return float("nan")
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    mean, std = norm
    losses = []
    net.train()
    for _ in range(steps):
        g = groups[rng.integers(len(groups))]
        idx = torch.as_tensor(rng.choice(g.n, size=min(batch, g.n), replace=False))
        scores = net((g.state[idx] - mean) / std, g.actions[idx], g.mask[idx], g.hw[idx])
        loss = ranking_loss(scores, g.target[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    net.eval()
    return float(np.mean(losses[-20:]))


def score(net, state, hw, action_list, norm):
    """Scores (higher = faster) of one task's traces, without gradients."""
    mean, std = norm
    actions, mask = pad(action_list)
    n = len(action_list)
    s = (torch.as_tensor(np.asarray(state, np.float32)) - mean) / std
    with torch.no_grad():
        return net(s.expand(n, -1), actions, mask,
                   torch.as_tensor(np.asarray(hw, np.float32)).expand(n, -1)).numpy().astype(np.float64)
