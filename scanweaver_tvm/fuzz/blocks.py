"""Source emitters for one recurrence block of a generated model.

Each emitter appends Python source lines to a ``Source`` (the model being written) and
records what ``find_recurrences`` must say about the block: accepted recurrences as
``[form, length, axis, reverse]`` (``None`` = not checked) and, for near misses, a substring
of the reason it must give.  Why they are written out as text: a failing case is then a
self-contained file anyone can run.
"""
from dataclasses import dataclass, field

# per-step coefficients (read a slice of a gate tensor each step) and loop-invariant ones
PER_STEP_A = ("gate", "signed", "sigmoid_step", "sigmoid_pre", "exp")
INVARIANT_A = ("param", "scalar", "full", "one")
B_KINDS = ("x", "cx", "ema", "xg", "bias", "tanh")
INITS = ("zeros", "input", "first")
OUTS = ("stack", "stack_other", "cat", "last", "middle", "reuse")
# near misses: (kind, reason substring or None when pieces of it are legitimately found)
NEAR_MISSES = {"tanh": "relax.tanh", "hh": "not affine in h", "hcoef": "not affine in h",
               "skip": "not consecutive", "repeat": "not consecutive",
               "mixed": "different time indices", "extra": None}


@dataclass
class Source:
    """The model being written: constructor lines, forward lines, inputs, outputs, expectation."""

    init: list = field(default_factory=list)
    body: list = field(default_factory=list)
    inputs: list = field(default_factory=list)     # (name, shape, "randn" | "rand" | "signed")
    outputs: list = field(default_factory=list)
    found: list = field(default_factory=list)
    rejected: list = field(default_factory=list)
    tags: set = field(default_factory=set)
    counter: int = 0
    last_step: str = ""

    def name(self, stem):
        self.counter += 1
        return f"{stem}{self.counter}"

    def add_input(self, stem, shape, kind="randn"):
        n = self.name(stem)
        self.inputs.append((n, tuple(shape), kind))
        return n

    def add_param(self, stem, shape, init="torch.randn({shape})"):
        n = self.name(stem)
        self.init.append(f"self.{n} = nn.Parameter({init.format(shape=tuple(shape))})")
        return f"self.{n}"

    def line(self, text, indent=0):
        self.body.append("    " * indent + text)


def slice_at(tensor, axis, index, rank, style):
    """``tensor`` at time ``index`` along ``axis``, spelled as users do (negative dims too)."""
    if style == "select":
        return f"{tensor}.select({axis}, {index})"
    if style == "select_neg":
        return f"{tensor}.select({axis - rank}, {index})"
    if style == "narrow":
        return f"{tensor}.narrow({axis}, {index}, 1).squeeze({axis})"
    if style == "ellipsis" and axis == rank - 1:
        return f"{tensor}[..., {index}]"
    return f"{tensor}[{', '.join([':'] * axis + [str(index)])}]"


def _a_expr(src, rng, kind, xshape, state, sl):
    """The coefficient a_t as a function of the time index expression ``t`` (str)."""
    if kind in ("gate", "signed"):
        g = src.add_input("g", xshape, "rand" if kind == "gate" else "signed")
        return lambda t: sl(g, t)
    if kind in ("sigmoid_step", "sigmoid_pre"):
        g = src.add_input("g", xshape)
        if kind == "sigmoid_step":
            return lambda t: f"torch.sigmoid({sl(g, t)})"
        ga = src.name("ga")
        src.line(f"{ga} = torch.sigmoid({g})")
        return lambda t: sl(ga, t)
    if kind == "exp":                        # Mamba-style exp(softplus(dt) * A), A < 0
        g = src.add_input("g", xshape)
        a_log = src.add_param("A_log", state[-1:], "torch.rand({shape}) - 1.0")
        dt, neg = src.name("dt"), src.name("A")
        src.line(f"{dt} = F.softplus({g})")
        src.line(f"{neg} = -torch.exp({a_log})")
        return lambda t: f"torch.exp({sl(dt, t)} * {neg})"
    if kind == "scalar":
        value = rng.choice(["0.9", "0.5", "-0.7"])
        return lambda t: value
    if kind in ("param", "full"):
        logit = src.add_param("logit", state[-1:] if kind == "param" else state)
        d = src.name("d")
        src.line(f"{d} = torch.sigmoid({logit})")
        return lambda t: d
    return None                              # a = 1


def _b_expr(src, rng, kind, x, xshape, state, sl, a):
    if kind == "cx":
        c = src.add_param("c", state[-1:])
        return lambda t: f"{c} * {sl(x, t)}"
    if kind == "ema":
        return lambda t: f"(1 - {a(t)}) * {sl(x, t)}"
    if kind == "xg":
        u = src.add_input("u", xshape)
        return lambda t: f"{sl(x, t)} * {sl(u, t)}"
    if kind == "bias":
        bias = src.add_param("bias", state[-1:])
        return lambda t: f"({sl(x, t)} + {bias})"     # (a*h + x) + c is another recurrence
    if kind == "tanh":
        return lambda t: f"torch.tanh({sl(x, t)})"
    return lambda t: sl(x, t)


# the same affine step in the spellings people use (each one a * h + b for some a, b)
STEP_FORMS = {"a*h+b": "{A} * h + {B}", "b+h*a": "{B} + h * {A}", "h*a+b": "h * {A} + {B}",
              "b+a*h": "{B} + {A} * h", "sum3": "{A} * h + {B} + 0.25",
              "clamp": "torch.clamp({A}, -0.99, 0.99) * h + {B}", "lerp": "torch.lerp(h, {B}, {A})",
              "h+a*(b-h)": "h + {A} * ({B} - h)", "convex": "(1 - {A}) * h + {A} * {B}",
              "negated": "-(-{A} * h - {B})", "minus": "h * {A} - (-{B})",
              "cast": "({A} * h.double() + {B}).to(h.dtype)"}
# forms whose offset is b itself, so that h_0 = b_0 reads as a step from zero (other forms
# compute the same b in another way; the pass may then keep h_0 as the initial state: L - 1)
PLAIN_STEPS = ("a*h+b", "b+h*a", "h*a+b", "b+a*h", "clamp", "h+b", "b+h")
SUM_FORMS = {"h+b": "h + {B}", "b+h": "{B} + h", "sum3": "h + {B} + 0.125",
             "cast": "({B} + h).to(h.dtype)"}


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def _step(rng, a, b, t, src=None):
    forms = SUM_FORMS if a is None else STEP_FORMS
    names = sorted(forms)
    if a is not None and _is_number(a(t)):
        names.remove("clamp")                  # torch.clamp takes a tensor
    name = rng.choice(names)
    if src is not None:
        src.tags.add(f"step:{name}")
        src.last_step = name
    return forms[name].format(A=None if a is None else a(t), B=b(t))


def affine(src, rng, x, xshape, near_miss=None):
    """A loop ``h = a_t*h + b_t`` over a random axis of ``x`` (or a near miss of it).
    Returns (output var, its shape) for later layers or blocks to use."""
    rank = len(xshape)
    long_axes = [d for d in range(rank) if xshape[d] >= 4]
    if near_miss and not long_axes:
        near_miss = None                # every near miss needs L >= 4 to be one
    axis = rng.choice(long_axes) if near_miss else rng.randrange(rank)
    length = xshape[axis]
    state = xshape[:axis] + xshape[axis + 1:]
    reverse = rng.random() < 0.4
    style = rng.choice(["select", "index", "ellipsis", "select_neg", "narrow"])
    sl = lambda tensor, t: slice_at(tensor, axis, t, rank, style)  # noqa: E731
    a_kind = rng.choice(PER_STEP_A + INVARIANT_A)
    if near_miss == "mixed" and a_kind not in PER_STEP_A:
        a_kind = rng.choice(PER_STEP_A)
    b_choices = [k for k in B_KINDS if not (k == "ema" and a_kind == "one")]
    b_kind = rng.choice(b_choices)
    init = rng.choice(INITS if near_miss is None else INITS[:2])
    out = rng.choice(OUTS if near_miss is None else ("stack", "last"))
    a = _a_expr(src, rng, a_kind, xshape, state, sl)
    b = _b_expr(src, rng, b_kind, x, xshape, state, sl, a)
    times = list(range(length))[::-1] if reverse else list(range(length))
    src.tags.update({f"a:{a_kind}", f"b:{b_kind}", f"init:{init}", f"out:{out}", f"axis:{axis}", f"slice:{style}",
                     "reverse" if reverse else "forward", f"near:{near_miss}" if near_miss else "affine"})
    src.line(f"# {'near miss ' + near_miss if near_miss else 'recurrence'}: L={length} axis={axis} "
             f"{'reverse' if reverse else 'forward'} a={a_kind} b={b_kind} init={init} out={out}")
    outs = src.name("outs")
    if init == "zeros":
        src.line(f"h = torch.zeros_like({sl(x, 0)})")
    elif init == "input":
        src.line(f"h = {src.add_input('h', state)}")
    else:                                           # h_0 = b_0: the first step from zero
        src.line(f"h = {b(times[0])}")
        times = times[1:]
    src.line(f"{outs} = {'[h]' if init == 'first' else '[]'}")
    steps = len(times)
    if near_miss == "skip":
        del times[rng.randrange(1, steps - 1)]
    elif near_miss == "repeat":
        k = rng.randrange(steps)
        times.insert(k, times[k])
    extra_at = rng.randrange(steps) if near_miss == "extra" and steps else None
    if near_miss == "mixed":
        src.line(f"for t in {times}:")
        first_a = a
        a = lambda t: first_a(f"{length - 1} - {t}")  # noqa: E731  (a reads the mirrored time)
        src.line(f"h = {_step(rng, a, b, 't')}", 1)
    else:
        src.line(f"for t in {times if near_miss in ('skip', 'repeat') else _range(times)}:")
        if near_miss == "tanh":
            src.line(f"h = torch.tanh({_step(rng, a, b, 't')})", 1)
        elif near_miss == "hh":
            src.line(f"h = h * h * 0.1 + 0.5 * {sl(x, 't')}", 1)
        elif near_miss == "hcoef":
            src.line(f"h = 0.5 * torch.sigmoid(h) * h + {b('t')}", 1)
        else:
            src.line(f"h = {_step(rng, a, b, 't', src)}", 1)
        if extra_at is not None:
            src.line(f"if t == {times[extra_at]}:", 1)
            src.line(f"h = h + 0.25 * torch.sin({sl(x, 't')})", 2)
    src.line(f"{outs}.append(h)", 1)
    exact = init != "first" or src.last_step in PLAIN_STEPS
    _expect(src, near_miss, steps, length if exact else None, axis, reverse, extra_at)
    n_out = len(times) + (init == "first")          # skip / repeat: not L
    return _output(src, rng, out, outs, axis, state, reverse, n_out)


def _range(times):
    if len(times) >= 2 and times[0] > times[-1]:
        return f"range({times[0]}, {times[-1] - 1}, -1)"
    return f"range({times[0]}, {times[-1] + 1})" if times else "range(0)"


def _expect(src, near_miss, steps, length, axis, reverse, extra_at):
    if near_miss is None:
        if steps >= 2:
            src.found.append(["affine", length, axis, reverse])
    elif near_miss == "extra":
        # the chain breaks at the odd step: the parts before and after it are honest
        # recurrences of their own (the part after starts from the odd step's state)
        for n in (extra_at + 1, steps - extra_at - 1):
            if n >= 2:
                src.found.append(["affine", n, axis, reverse])
    else:                                  # L >= 4: always a reportable near miss
        src.rejected.append(NEAR_MISSES[near_miss])


def _output(src, rng, out, outs, axis, state, reverse, length):
    rank = len(state) + 1
    y = src.name("y")
    if reverse and out != "last" and rng.random() < 0.7:
        src.line(f"{outs} = {outs}[::-1]")            # time order; else stacked backwards
    if out == "last":
        src.line(f"{y} = h")
        return y, state
    if out == "stack_other" and rank > 1:
        other = rng.choice([d for d in range(rank) if d != axis])
        src.line(f"{y} = torch.stack({outs}, {rng.choice([other, other - rank])})")
        return y, state[:other] + (length,) + state[other:]
    if out == "cat":
        d = rng.randrange(len(state))
        src.line(f"{y} = torch.cat({outs}, {d})")
        return y, state[:d] + (state[d] * length,) + state[d + 1:]
    dim = rng.choice([str(axis), f"dim={axis - rank}", str(axis - rank)])   # negative/keyword
    src.line(f"{y} = torch.stack({outs}, {dim})")
    shape = state[:axis] + (length,) + state[axis:]
    if out == "middle":                              # an intermediate state returned as well
        mid = src.name("mid")
        src.line(f"{mid} = {outs}[{length // 2}] * 2.0")
        src.outputs.append(mid)
    elif out == "reuse":                             # ... or used by later computation
        src.line(f"{y} = {y} + {outs}[{length // 3}].unsqueeze({axis})")
    return y, shape


def selective(src, rng, length):
    """Mamba's reference selective-scan loop on random (B, D, L, N), fp32."""
    bsz, dim, n = rng.choice([1, 2]), rng.choice([2, 3, 4]), rng.choice([2, 4])
    u, delta = src.add_input("u", (bsz, dim, length)), src.add_input("delta", (bsz, dim, length))
    bm, cm = src.add_input("Bm", (bsz, n, length)), src.add_input("Cm", (bsz, n, length))
    a_log = src.add_param("A_log", (dim, n), "torch.rand({shape})")
    use_d, use_z, use_bias = rng.random() < 0.5, rng.random() < 0.5, rng.random() < 0.5
    src.tags.update({"selective"} | {f"selective:{k}" for k, v in (("D", use_d), ("z", use_z), ("bias", use_bias)) if v})
    src.line(f"# selective scan: B={bsz} D={dim} L={length} N={n}")
    dl = src.name("dl")
    if use_bias:
        bias = src.add_param("dbias", (dim,))
        src.line(f"{dl} = F.softplus({delta} + {bias}[..., None])")
    else:
        src.line(f"{dl} = {delta}")
    A, x, ys, y = src.name("A"), src.name("s"), src.name("ys"), src.name("y")
    src.line(f"{A} = -torch.exp({a_log})")
    src.line(f"{x} = {A}.new_zeros(({bsz}, {dim}, {n}))")
    src.line(f"da = torch.exp(torch.einsum('bdl,dn->bdln', {dl}, {A}))")
    src.line(f"dbu = torch.einsum('bdl,bnl,bdl->bdln', {dl}, {bm}, {u})")
    src.line(f"{ys} = []")
    src.line(f"for i in range({length}):")
    src.line(f"{x} = da[:, :, i] * {x} + dbu[:, :, i]", 1)
    src.line(f"{ys}.append(torch.einsum('bdn,bn->bd', {x}, {cm}[:, :, i]))", 1)
    src.line(f"{y} = torch.stack({ys}, dim=2)")
    if use_d:
        d = src.add_param("Dp", (dim,))
        src.line(f"{y} = {y} + {u} * {d}[:, None]")
    if use_z:
        z = src.add_input("z", (bsz, dim, length))
        src.line(f"{y} = {y} * F.silu({z})")
    if length >= 2:
        src.found.append(["selective", length, None, False])
    return y, (bsz, dim, length)
