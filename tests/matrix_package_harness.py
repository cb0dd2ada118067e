"""What ``test_matrix_package_forms.py`` and ``test_matrix_package_near_misses.py`` share: each
layer's seeded inputs and model, the check that a module holds the expected matrix scans and no
tensor of the state sequence's size, the comparison with PyTorch's float64 outputs, and the
ONNX export."""
import io
import warnings

import numpy as np
import onnx
import torch
import torch.nn.functional as F

from matrix_package_layers import (B, DK, DV, H, L, TwoGLALayers, delta_rule, gla_decay_in_two_statements,
                                   gla_key_and_value_gates, gla_naive, gsa_two_passes, hgrn2_naive,
                                   linear_attention_bmm, linear_attention_naive, linear_attention_recurrent,
                                   mamba2_cache_steps, normalized_state, retention_integer_gamma,
                                   retention_recurrent, rwkv6_naive, simple_gla_naive, ssd_recurrent,
                                   ssd_recurrent_groups, ssd_state_update_steps)
from test_matrix_forms import Fn, _largest_tensor


# -- inputs --------------------------------------------------------------------------------------
def _inputs(name, b=B, length=L, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen)

    def gate(*shape):                 # log gates in (-1, 0)
        return -torch.rand(*shape, generator=gen)

    bhl = (b, H, length)
    blh = (b, length, H)
    args = {
        "gla_naive": lambda: (r(*blh, DK), r(*blh, DK), r(*blh, DV), gate(*blh, DK), r(b, H, DK, DV)),
        "simple_gla_naive": lambda: (r(*bhl, DK), r(*bhl, DK), r(*bhl, DV), gate(*bhl)),
        "retention_recurrent": lambda: (r(*bhl, DK), r(*bhl, DK), r(*bhl, DV)),
        "linear_attention_naive": lambda: (r(*blh, DK), r(*blh, DK), r(*blh, DV), r(b, H, DK, DV)),
        "linear_attention_recurrent": lambda: (r(*blh, DK), r(*blh, DK), r(*blh, DV)),
        "linear_attention_bmm": lambda: (r(b, length, H * DK), r(b, length, H * DK), r(b, length, H * DV)),
        "hgrn2_naive": lambda: (r(*bhl, DK), gate(*bhl, DK), r(*bhl, DV)),
        "ssd_recurrent": lambda: (r(*blh, DV), torch.rand(*blh, generator=gen), gate(H), r(b, length, DK),
                                  r(b, length, DK), r(H)),
        "ssd_recurrent_groups": lambda: (r(b, length, 4, DV), torch.rand(b, length, 4, generator=gen), gate(4),
                                         r(b, length, 2, DK), r(b, length, 2, DK), r(4)),
        "mamba2_cache_steps": lambda: (r(b, length, 4, DV), r(b, length, 4), r(4), r(b, length, 2, DK),
                                       r(b, length, 2, DK), r(4), r(4)),
        "two_gla_layers": lambda: (r(b, length, 12),),
        "ssd_state_update_steps": lambda: (r(*blh, DV), r(*blh), r(b, length, DK), r(b, length, DK), r(H),
                                           r(*blh, DV), r(H)),
        "gla_decay_in_two_statements": lambda: (r(*bhl, DK), r(*bhl, DK), r(*bhl, DV), gate(*bhl, DK),
                                                r(*bhl, DV)),
        "gsa_two_passes": lambda: (r(*bhl, DK), r(*bhl, DK), r(*bhl, DV), r(*bhl, 3), gate(*bhl, 3)),
        "gla_key_and_value_gates": lambda: (r(*bhl, DK), r(*bhl, DK), r(*bhl, DV), gate(*bhl, DK), gate(*bhl, DV)),
        "delta_rule": lambda: (r(*bhl, DK), F.normalize(r(*bhl, DK), dim=-1), r(*bhl, DV),
                               torch.rand(*bhl, generator=gen)),
        "normalized_state": lambda: (r(*bhl, DK), r(*bhl, DK), r(*bhl, DV)),
        "rwkv6_naive": lambda: (r(*bhl, DK), r(*bhl, DK), r(*bhl, DV), gate(*bhl, DK), r(H, DK), r(b, H, DK, DV)),
        "retention_integer_gamma": lambda: (r(*bhl, DK), r(*bhl, DK), r(*bhl, DV)),
    }[name]()
    return tuple(a.to(dtype) for a in args)


LAYERS = {f.__name__: f for f in (gla_naive, simple_gla_naive, retention_recurrent, linear_attention_naive,
                                  linear_attention_recurrent, linear_attention_bmm, hgrn2_naive, ssd_recurrent,
                                  ssd_recurrent_groups, mamba2_cache_steps, ssd_state_update_steps,
                                  gla_decay_in_two_statements, gsa_two_passes, delta_rule, normalized_state,
                                  rwkv6_naive, gla_key_and_value_gates, retention_integer_gamma)}


def _model(name):
    return TwoGLALayers() if name == "two_gla_layers" else Fn(LAYERS[name])


def _matrix(recs):
    return [r for r in recs if r.form == "matrix" and not r.rejected]


def _assert_matrix_scans(fused, recs, count=1):
    matrix = _matrix(recs)
    assert len(matrix) == count, [(r, r.matrix_miss) for r in recs]
    assert fused["main"].script().count('"scanweaver.matrix_scan"') == count
    sequence = min(int(np.prod(r.state_shape)) * r.length for r in matrix)
    assert _largest_tensor(fused) < sequence, "a tensor of the state sequence's size is left"


def _close(got, want, rtol):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        err = np.abs(np.asarray(g, np.float64) - w).max() / max(1.0, np.abs(w).max())
        assert err <= rtol, f"relative error {err:.2e}"


def _want(model, args):
    """PyTorch's outputs as float64."""
    with torch.no_grad():
        out = model(*args)
    return [o.double().numpy() for o in (out if isinstance(out, tuple) else (out,))]


def _export(model, args):
    f = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(args), f, dynamo=False, opset_version=17)
    return onnx.load_from_string(f.getvalue())
