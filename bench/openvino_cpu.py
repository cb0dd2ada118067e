"""OpenVINO's CPU plugin on a PyTorch module, as a peer in a timed run."""
import os


def compile_openvino(module, example, hints=(None,), weights=None):
    """``ov.convert_model`` of ``module`` (float32, traced on the tuple ``example``; converted
    once) compiled for the CPU plugin at each of ``hints`` (``"f32"``; None: its default, bf16
    on AVX512-BF16 / AMX CPUs) with every core, latency mode.  ``weights``: one of our weight
    format names (``int8``, ``int4_asym_g32``, ...), the converted model's weights compressed
    by NNCF's ``compress_weights`` in the same format (its embeddings and last layer at its
    8-bit backup, as ours keep the head).  hint -> ``(run, the precision it chose)``, or
    ``(None, why)`` where the conversion or the compile fails (a failed peer is a cell of the
    table, not the run).  A run takes new inputs of the example's shapes, or none (the example)."""
    import torch

    try:
        import openvino as ov                      # (pyproject's bench extra)

        with torch.no_grad():
            converted = ov.convert_model(module, example_input=example)
        if weights:
            converted = _compressed(converted, weights)
    except Exception as e:  # pylint: disable=broad-except
        return {hint: (None, f"failed: {type(e).__name__}") for hint in hints}
    return {hint: _compiled(ov, converted, [x.numpy() for x in example], hint) for hint in hints}


def _compressed(converted, weights):
    """``converted`` with NNCF's weight compression in our format ``weights``."""
    import nncf                                    # (pyproject's bench extra)

    from scanweaver_core.weight_formats import weight_format

    fmt = weight_format(weights)
    mode = getattr(nncf.CompressWeightsMode, f"INT{fmt.bits}_{'SYM' if fmt.symmetric else 'ASYM'}")
    if fmt.bits == 8:
        return nncf.compress_weights(converted, mode=mode)
    from nncf.quantization.advanced_parameters import AdvancedCompressionParameters, GroupSizeFallbackMode

    adjust = AdvancedCompressionParameters(group_size_fallback_mode=GroupSizeFallbackMode.ADJUST)   # (K off the
    return nncf.compress_weights(converted, mode=mode, group_size=fmt.group, ratio=1.0,          # group: a
                                 advanced_parameters=adjust)                                      # smaller one)


def _compiled(ov, converted, feed, hint):
    try:
        config = {"INFERENCE_NUM_THREADS": os.cpu_count() or 1, "PERFORMANCE_HINT": "LATENCY"}
        if hint:
            config["INFERENCE_PRECISION_HINT"] = hint
        compiled = ov.Core().compile_model(converted, "CPU", config)
        request = compiled.create_infer_request()
        chosen = compiled.get_property("INFERENCE_PRECISION_HINT")

        def run(*inputs):          # (other inputs of the example's shapes: no new compile)
            request.infer([x.numpy() for x in inputs] if inputs else feed)
            return request.get_output_tensor(0).data

        return run, getattr(chosen, "get_type_name", lambda: str(chosen))()
    except Exception as e:  # pylint: disable=broad-except
        return None, f"failed: {type(e).__name__}"
