"""The latent-dynamics network: encode the initial state, roll actions forward, score.

``z_0 = enc(state)``; for each action ``a_t``: ``z_t = GRUCell(emb(a_t), z_{t-1})`` (padding
steps leave ``z`` unchanged); the head scores ``[z_T, mean_t emb(a_t), mean_t a_t, hw]``.
The score is a log-throughput-like value: higher is faster.  Small (hidden 64, ~40k weights).
"""
import torch
from torch import nn


class LatentDynamics(nn.Module):
    def __init__(self, state_dim, action_dim, hw_dim, hidden=64):
        super().__init__()
        self.dims = dict(state_dim=state_dim, action_dim=action_dim, hw_dim=hw_dim, hidden=hidden)
        self.encoder = nn.Sequential(nn.Linear(state_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.embed = nn.Sequential(nn.Linear(action_dim, hidden), nn.ReLU())
        self.cell = nn.GRUCell(hidden, hidden)
        self.head = nn.Sequential(nn.Linear(2 * hidden + action_dim + hw_dim, hidden), nn.ReLU(),
                                  nn.Linear(hidden, 1))

    def forward(self, state, actions, mask, hw):
        """state [B,S], actions [B,T,A], mask [B,T] (1 = real action), hw [B,H] -> scores [B]."""
        z = self.encoder(state)
        emb = self.embed(actions)
        for t in range(actions.shape[1]):
            step = self.cell(emb[:, t], z)
            keep = mask[:, t:t + 1]
            z = keep * step + (1 - keep) * z
        count = mask.sum(1, keepdim=True).clamp(min=1)
        emb_mean = (emb * mask.unsqueeze(-1)).sum(1) / count
        act_mean = (actions * mask.unsqueeze(-1)).sum(1) / count
        return self.head(torch.cat([z, emb_mean, act_mean, hw], dim=1)).squeeze(-1)
