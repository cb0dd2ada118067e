"""OpenVINO's CPU plugin on a PyTorch module, as a peer in a timed run."""
import os


def compile_openvino(module, example, hint=None):
    """``ov.convert_model`` of ``module`` (float32, traced on the tuple ``example``) compiled for
    the CPU plugin at ``hint`` (``"f32"``; None: its default, bf16 on AVX512-BF16 / AMX CPUs)
    with every core, latency mode.  ``(run, the precision it chose)``; ``(None, why)`` where
    the conversion or the compile fails (a failed peer is a cell of the table, not the run)."""
    import torch

    try:
        import openvino as ov                      # (pyproject's bench extra)

        with torch.no_grad():
            converted = ov.convert_model(module, example_input=example)
        config = {"INFERENCE_NUM_THREADS": os.cpu_count() or 1, "PERFORMANCE_HINT": "LATENCY"}
        if hint:
            config["INFERENCE_PRECISION_HINT"] = hint
        compiled = ov.Core().compile_model(converted, "CPU", config)
        request, feed = compiled.create_infer_request(), [x.numpy() for x in example]
        chosen = compiled.get_property("INFERENCE_PRECISION_HINT")

        def run():
            request.infer(feed)
            return request.get_output_tensor(0).data

        return run, getattr(chosen, "get_type_name", lambda: str(chosen))()
    except Exception as e:  # pylint: disable=broad-except
        return None, f"failed: {type(e).__name__}"
