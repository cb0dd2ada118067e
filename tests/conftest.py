"""Fixtures shared by the test modules."""
import pytest


@pytest.fixture
def emulated_amx(monkeypatch):
    """``dense_cpu`` schedules its AMX kernel for any target, with ``amx_bf16.EmulatedTiles``
    (the tile instructions as TIR loops over a local tile file): the very kernel, addresses and
    all, run on a CPU without AMX.  Its value: the depths the kernel was tensorized for."""
    from tir_schedules import amx_bf16

    native, depths = amx_bf16.intrin, []

    def emulated(depth):
        depths.append(depth)
        return native(depth, amx_bf16.EmulatedTiles)

    monkeypatch.setattr(amx_bf16, "available", lambda target: True)
    monkeypatch.setattr(amx_bf16, "intrin", emulated)
    return depths


@pytest.fixture(autouse=True, scope="session")
def _one_import_per_model():
    """A model's steps imported once per test process (``import_cache``); ``SW_IMPORT_CACHE=0``
    imports every time."""
    import os

    if os.environ.get("SW_IMPORT_CACHE", "1") == "0":
        yield
        return
    from import_cache import memoized
    from scanweaver_tvm import causal_lm_steps

    original = causal_lm_steps.import_steps
    causal_lm_steps.import_steps = memoized(original)
    yield
    causal_lm_steps.import_steps = original
