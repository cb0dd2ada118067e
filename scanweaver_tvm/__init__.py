"""ScanWeaver-TVM: first-order affine recurrences as parallel scans in TVM.

The front door.  ``AffineScanSpec`` / ``SelectiveScanSpec`` describe a scan once for every
stage; ``reference`` holds their float64 oracles; ``algebra`` the affine-pair composition.
"""
from . import algebra, reference
from .spec import AffineScanSpec, SelectiveScanSpec

__all__ = ["AffineScanSpec", "SelectiveScanSpec", "algebra", "reference"]
