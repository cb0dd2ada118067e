"""ScanWeaver's shared vocabulary, below every layer: it imports nothing else of ours.

- ``spec``: ``AffineScanSpec`` / ``SelectiveScanSpec`` / ``MatrixScanSpec`` /
  ``StabilizedScanSpec``, one immutable description per scan;
- ``algebra``: the scans' associative operators (affine pairs, the max-stabilized monoid),
  written once;
- ``reference``: float64 numpy oracles;
- ``scan_op``: how a scan appears in Relax (``make_scan``, ``parse_scan``, ``emit_affine_scan``);
- ``affine``: the affine reading of a step (``affine_in``), shared by the Relax pass and the
  frontends' loop converters; ``exprs``: the Relax facts it and the pass read (cached);
- ``targets``: the host target.
"""
