"""The scan specs, one module per family; ``scanweaver_core.spec`` re-exports them all."""
