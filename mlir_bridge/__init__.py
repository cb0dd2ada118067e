"""The MLIR realization of ScanWeaver scans (scanweaver dialect -> gpu/NVVM/PTX, and a CPU
route): not built yet; ``realization="mlir"`` is refused with a clear error until it is."""
