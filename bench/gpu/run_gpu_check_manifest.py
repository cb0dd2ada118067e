"""What ``run_gpu_check.py`` checks a manifest's launches against: the format it reads, the
device inputs it draws for every buffer, the float64 torch reference of the manifest's scan and
the PyTorch eager loop it is timed next to.  Needs only torch (no TVM, nothing of this
repository), like the runner it serves."""
import math

import torch

FORMAT = "scanweaver-gpu/1"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64, "int32": torch.int32, "int64": torch.int64}


# ---------------------------------------------------------------- scans in torch

def plain_scan(a, b, h0=None, axis=-1, reverse=False):
    """All states of h_t = a_t*h_{t-1} + b_t along ``axis``, in b's dtype (a broadcasts)."""
    a = torch.broadcast_to(a, b.shape).movedim(axis, -1)
    b = b.movedim(axis, -1)
    out = torch.empty_like(b)
    h = torch.zeros_like(b[..., 0]) if h0 is None else h0.to(b.dtype)
    for t in (range(b.shape[-1] - 1, -1, -1) if reverse else range(b.shape[-1])):
        h = torch.addcmul(b[..., t], a[..., t], h)
        out[..., t] = h
    return out.movedim(-1, axis)


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                   h0=None):
    """Mamba's ``selective_scan_ref`` in the inputs' dtype: returns (out, last_state)."""
    F = torch.nn.functional
    dt = delta if delta_bias is None else delta + delta_bias[:, None].to(delta.dtype)
    dt = F.softplus(dt) if delta_softplus else dt
    A = A.to(u.dtype)
    deltaA = torch.exp(torch.einsum("bdl,dn->bdln", dt, A))
    if B.dim() == 3:
        deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", dt, B, u)
    else:  # groups: (B,G,N,L) -> (B,D,N,L)
        B, C = (x.repeat_interleave(u.shape[1] // x.shape[1], dim=1) for x in (B, C))
        deltaB_u = torch.einsum("bdl,bdnl,bdl->bdln", dt, B, u)
    h = u.new_zeros(u.shape[0], u.shape[1], A.shape[1]) if h0 is None else h0.to(u.dtype)
    ys = []
    for i in range(u.shape[2]):
        h = deltaA[:, :, i] * h + deltaB_u[:, :, i]
        ys.append(torch.einsum("bdn,bn->bd", h, C[:, :, i]) if C.dim() == 3
                  else torch.einsum("bdn,bdn->bd", h, C[:, :, :, i]))
    out = torch.stack(ys, dim=2)
    out = out if D is None else out + u * D[:, None].to(u.dtype)
    out = out if z is None else out * F.silu(z)
    return out, h


# ---------------------------------------------------------------- inputs and reference

def make_inputs(m, dev, seed=0):
    """Device tensors for every buffer: inputs drawn like bench.anchors, outputs/scratch zero."""
    g = torch.Generator(device=dev).manual_seed(seed)
    spec, bufs = m["spec"], {}
    for buf in m["buffers"]:
        name, shape, dtype = buf["name"], tuple(buf["shape"]), DTYPES[buf["dtype"]]
        f32 = dict(device=dev, dtype=torch.float32, generator=g)
        if buf["role"] != "input":
            x = torch.zeros(shape, device=dev, dtype=dtype)
        elif name == "a":
            x = 0.8 + 0.2 * torch.rand(shape, **f32)
        elif name == "A":
            x = -torch.arange(1, shape[1] + 1, device=dev, dtype=torch.float32).expand(shape)
        elif name == "delta":
            x = 0.5 * torch.randn(shape, **f32)
        elif name == "delta_bias":
            x = math.log(math.expm1(0.01)) + torch.rand(shape, **f32)
        else:
            x = torch.randn(shape, **f32)
        bufs[name] = x.to(dtype).contiguous()
    return bufs


def reference(m, bufs):
    """{output buffer name: float64 reference} for the manifest's kind and spec."""
    s, x = m["spec"], {k: v.double() for k, v in bufs.items()}
    if m["kind"] == "plain":
        a = x["a"].reshape(s["a_shape"])
        states = plain_scan(a, x["b"], x.get("h0"), s["axis"], s["reverse"])
        last = states.select(s["axis"], 0 if s["reverse"] else states.shape[s["axis"]] - 1)
        return {"states": states, "last": last}
    out, last = selective_scan(x["u"], x["delta"], x["A"], x["B"], x["C"], x.get("D"),
                               x.get("z"), x.get("delta_bias"), s["delta_softplus"], x.get("h0"))
    return {"out": out, "last_state": last}


def torch_loop(m, bufs):
    """The PyTorch eager baseline on the same (input-dtype) tensors."""
    s = m["spec"]
    if m["kind"] == "plain":
        a = bufs["a"].reshape(s["a_shape"])
        return lambda: plain_scan(a, bufs["b"], bufs.get("h0"), s["axis"], s["reverse"])
    args = [bufs.get(k) for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")]
    return lambda: selective_scan(*args, s["delta_softplus"], bufs.get("h0"))
