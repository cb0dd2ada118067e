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
