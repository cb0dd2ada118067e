"""One import of a model's steps per test process: ``causal_lm_steps.import_steps`` memoized.

Several test files compile the same tiny model (Qwen3-Next in float32 by the hybrid, int8,
int4 and bf16-prefill tests, say), and the import (``torch.export`` at three prompt sizes, the
pass, the generalization) is most of a build.  The weight format, the target's lowering and
everything after the import still run per test, each on its own copy of the module (a pass
may set functions in the module it is given), so a test cannot change another's.  The key is
what the import reads: the model's class, config and weights, the step shapes, the state
layout, and the identity of every function of the model's code and of ours (a test that
patches one, by ``monkeypatch`` or by hand, misses the cache and imports afresh).
``SW_IMPORT_CACHE=0`` turns it off; ``SW_IMPORT_CACHE_LOG=FILE`` appends each hit's saved
seconds."""
import hashlib
import os
import sys
import time

import torch

OURS = ("scanweaver_tvm", "relax_pass", "scanweaver_core", "tir_schedules", "mlir_bridge")


def memoized(import_steps):
    """``import_steps`` answering a repeated import from memory."""
    cache = {}

    def cached(model, layout, batch, target, prompt_sizes, shortest, ranks=None):
        key = fingerprint(model, layout, batch, target, prompt_sizes, shortest, ranks)
        if key in cache:
            mod, seconds = cache[key]
            _log(f"hit {type(model).__name__} saved {seconds:.1f} s")
            return mod.clone()
        start = time.perf_counter()
        mod = import_steps(model, layout, batch, target, prompt_sizes, shortest, ranks)
        cache[key] = (mod.clone(), time.perf_counter() - start)   # (a pass may set a function in
        return mod                                                 # the module it is given)

    return cached


def fingerprint(model, layout, batch, target, prompt_sizes, shortest, ranks):
    """A digest of everything ``import_steps`` reads."""
    digest = hashlib.sha256()

    def add(*parts):
        for part in parts:
            digest.update(repr(part).encode())
            digest.update(b"\0")

    add(type(model).__module__, type(model).__qualname__, model.config.to_json_string(use_diff=False),
        getattr(model.config, "_attn_implementation", None), batch, str(target), tuple(prompt_sizes), shortest,
        ranks, type(layout).__qualname__, vars(layout), torch.get_default_dtype(),
        sorted((k, v) for k, v in os.environ.items() if k.startswith("SCANWEAVER")))
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        data = tensor.detach().cpu().contiguous()
        add(name, str(data.dtype), tuple(data.shape))
        digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    add(_code_identity(model))
    return digest.hexdigest()


def _code_identity(model):
    """The ids of the functions the import may call: those of the model's classes (every
    module's, with their bases), of the modules defining them, of the model's own instances,
    and of our packages."""
    classes = {cls for module in model.modules() for cls in type(module).__mro__}
    names = {cls.__module__ for cls in classes} | {n for n in sys.modules if n.split(".")[0] in OURS}
    ids = []
    for name in sorted(names):
        ids.extend(_callables(vars(sys.modules[name])) if name in sys.modules else ())
    for cls in sorted(classes, key=lambda c: (c.__module__, c.__qualname__)):
        ids.extend(_callables(vars(cls)))
    for module in model.modules():
        ids.extend(_callables(vars(module)))
    return tuple(ids)


def _callables(namespace):
    return [(key, id(value)) for key, value in namespace.items()
            if callable(value) and not isinstance(value, type)]


def _log(line):
    path = os.environ.get("SW_IMPORT_CACHE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")
