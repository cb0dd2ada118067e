"""Ranking quality of predicted scores against measured latencies (one task at a time).

Top-k picks break ties among equal scores in a fixed random order, not by record position: a
model that predicts a constant must not inherit the order the records were stored in (a
database lists them fastest first).
"""
import numpy as np


def predicted_order(scores, seed=0):
    """Indices from highest to lowest score; equal scores in a seeded random order."""
    scores = np.asarray(scores, np.float64)
    perm = np.random.default_rng(seed).permutation(len(scores))
    return perm[np.argsort(-scores[perm], kind="stable")]


def kendall_tau(scores, secs):
    """Kendall tau-b between scores (higher = faster) and speed (1/latency); pairs of ties skipped."""
    s = np.asarray(scores, np.float64)
    v = -np.asarray(secs, np.float64)
    ds = np.sign(s[:, None] - s[None, :])
    dv = np.sign(v[:, None] - v[None, :])
    iu = np.triu_indices(len(s), 1)
    ds, dv = ds[iu], dv[iu]
    denom = np.sqrt((ds != 0).sum() * (dv != 0).sum())
    return float((ds * dv).sum() / denom) if denom > 0 else 0.0


def top_k_recall(scores, secs, k):
    """Fraction of the k truly fastest records among the k predicted fastest."""
    k = min(k, len(secs))
    truth = set(np.argsort(np.asarray(secs))[:k].tolist())
    pred = set(predicted_order(scores)[:k].tolist())
    return len(truth & pred) / k


def best_in_top_k(scores, secs, k):
    """1.0 when the fastest record is among the k predicted fastest (top-1 recall for k=1)."""
    best = int(np.argmin(np.asarray(secs)))
    return float(best in predicted_order(scores)[:k].tolist())
