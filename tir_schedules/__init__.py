"""TensorIR realizations of ScanWeaver scans (see README.md in this folder for the conventions)."""
