"""MODEL arguments of the ``scanweaver-tvm`` CLI: parse them, load the model, import it.

MODEL is an ONNX file (``model.onnx``), a transformers checkpoint directory (what
``save_pretrained`` writes), or a factory, ``path/to/file.py:make`` or ``package.module:make``,
whose call returns ``(torch model, example inputs)``.  Problems are ``CLIError``s whose message
is the one line the CLI prints.
"""
import contextlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from pathlib import Path


CHECKPOINT_LENGTH = 16      # the prompt length a checkpoint is traced at unless --length says


class CLIError(Exception):
    """A user-facing failure: its message is printed as the one error line."""


# -- output ----------------------------------------------------------------------------------

def _one_line(text, limit=600):
    lines = [" ".join(line.split()) for line in str(text).splitlines()]
    text = "; ".join(line for line in lines if line)
    return text if len(text) <= limit else text[:limit] + " ... (--debug shows all of it)"


def _describe(err):
    """An exception as one line; ValueErrors (the importers' and our API's "bad input" errors)
    speak for themselves, anything else is named."""
    msg = _one_line(err) or "(no message)"
    return msg if isinstance(err, ValueError) else f"{type(err).__name__}: {msg}"


class ModelSpec:
    """A parsed MODEL argument: ``kind`` is "onnx", "checkpoint" (a directory), "file" (a .py
    path) or "module"."""

    def __init__(self, text):
        self.text = text
        self.kind, self.path, self.module, self.factory = None, None, None, None
        if not text:
            raise CLIError("MODEL is empty: give a .onnx file, a checkpoint directory or FILE.py:FACTORY / "
                           "package.module:FACTORY")
        if Path(text).is_dir():            # (before the ':' split: a folder's name may hold one)
            if not (Path(text) / "config.json").is_file():
                raise CLIError(f"MODEL {text!r} is a directory without config.json: not a transformers "
                               "checkpoint (save_pretrained writes one), nor an ONNX file")
            self.kind, self.path = "checkpoint", Path(text)
            return
        source, sep, factory = text.rpartition(":")
        if not sep:
            path = Path(text)
            if text.lower().endswith(".onnx"):
                if not path.is_file():
                    raise CLIError(f"model file not found: {text}")
                self.kind, self.path = "onnx", path
                return
            if text.endswith(".py"):
                raise CLIError(f"MODEL {text!r}: name the factory to call, e.g. {text}:make_model")
            if path.is_file():   # an ONNX file without the suffix: let the importer judge it
                self.kind, self.path = "onnx", path
                return
            raise CLIError(f"MODEL {text!r}: not an existing .onnx file or checkpoint directory, nor "
                           "FILE.py:FACTORY or package.module:FACTORY")
        if not factory.isidentifier():
            raise CLIError(f"MODEL {text!r}: the factory after ':' must be a Python name, got {factory!r}")
        if not source:
            raise CLIError(f"MODEL {text!r}: nothing before ':' (FILE.py:FACTORY or package.module:FACTORY)")
        self.factory = factory
        if source.endswith(".py") or "/" in source or os.sep in source:
            path = Path(source)
            if not path.is_file():
                raise CLIError(f"model file not found: {source}")
            self.kind, self.path = "file", path
        elif all(part.isidentifier() for part in source.split(".")):
            self.kind, self.module = "module", source
        else:
            raise CLIError(f"MODEL {text!r}: {source!r} is neither a .py file nor a dotted module name")

    def __str__(self):
        return self.text


def model_arg(args):
    """The ``MODEL`` argument as a ``ModelSpec``, with ``--length`` checked against its kind."""
    spec = ModelSpec(args.model)
    if args.length is not None and spec.kind == "onnx":
        raise CLIError("--length applies to factory MODELs only, not ONNX files")
    return spec


def _load_python_module(spec):
    if spec.kind == "module":
        try:
            return importlib.import_module(spec.module)
        except ImportError as err:
            raise CLIError(f"cannot import module {spec.module!r}: {_one_line(err)}") from err
        except Exception as err:
            raise CLIError(f"importing module {spec.module!r} raised {_describe(err)}") from err
    path = spec.path.resolve()
    name = "_scanweaver_model_" + re.sub(r"\W", "_", path.stem)
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise CLIError(f"cannot load {spec.path} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))      # so the file can import its neighbours
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:
        sys.modules.pop(name, None)
        raise CLIError(f"running {spec.path} raised {_describe(err)}") from err
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(path.parent))
    return module


def _call_factory(spec, length):
    module = _load_python_module(spec)
    factory = getattr(module, spec.factory, None)
    where = spec.module or spec.path
    if factory is None:
        raise CLIError(f"{where} has no {spec.factory!r}")
    if not callable(factory):
        raise CLIError(f"{where}:{spec.factory} is not callable")
    kwargs = {}
    if length is not None:
        try:
            params = inspect.signature(factory).parameters.values()
        except (TypeError, ValueError):
            params = []
        if not any(p.name == "length" or p.kind is p.VAR_KEYWORD for p in params):
            raise CLIError(f"--length: {spec}() takes no 'length' keyword")
        kwargs["length"] = length
    try:
        made = factory(**kwargs)
    except Exception as err:
        raise CLIError(f"{spec}() raised {_describe(err)}") from err
    import torch

    if not (isinstance(made, (tuple, list)) and len(made) == 2):
        raise CLIError(f"{spec}() must return (torch model, example inputs), got {type(made).__name__}")
    model, example = made
    if not isinstance(model, torch.nn.Module):
        raise CLIError(f"{spec}() returned {type(model).__name__} as the model, not a torch.nn.Module")
    if isinstance(example, torch.Tensor):
        example = (example,)
    if not isinstance(example, (tuple, list)) or not all(isinstance(x, torch.Tensor) for x in example):
        raise CLIError(f"{spec}(): the example inputs must be a tensor or a tuple of tensors")
    return model.eval(), tuple(example)


@contextlib.contextmanager
def quiet_transformers(debug=False):
    """transformers' loading bars and notices off (``--debug`` keeps them): the CLI's stderr
    holds its own progress lines and one-line errors."""
    if debug:
        yield
        return
    from transformers.utils import logging

    bars, level = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def _load_checkpoint(spec, length):
    """The checkpoint as ``compile_causal_lm`` loads a directory (``AutoModelForCausalLM``,
    eval mode) and the example it is traced on: token ids of shape (1, ``length``)."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(spec.path).eval()
    except Exception as err:
        raise CLIError(f"cannot load checkpoint {spec.path}: {_describe(err)}") from err
    return model, (torch.zeros((1, length or CHECKPOINT_LENGTH), dtype=torch.long),)


def dynamic_dims(values):
    """``--dynamic-dim INPUT:DIM[=NAME]`` values as ``torch.export``'s ``dynamic_shapes`` (a
    dict keyed by input index or name).  Unnamed, a leading dim is ``batch`` and any other ``L``:
    inputs that share a dim share its name."""
    shapes = {}
    for text in values or ():
        where, _, name = text.partition("=")
        arg, sep, dim = where.rpartition(":")
        try:
            axis = int(dim)
        except ValueError:
            axis = None
        if not sep or not arg or axis is None or text.endswith("="):
            raise CLIError(f"--dynamic-dim {text}: expected INPUT:DIM or INPUT:DIM=NAME, e.g. "
                           "0:1, x:1 or input_ids:1=L (INPUT: an index or forward's argument name)")
        key = int(arg) if arg.lstrip("-").isdigit() else arg
        shapes.setdefault(key, {})[axis] = name or ("batch" if axis == 0 else "L")
    return shapes or None


def _import_model(spec, length, steps, dynamic=None):
    """The Relax IRModule of MODEL; ``dynamic``: ``--dynamic-dim`` values (torch MODELs)."""
    with steps(f"importing {spec}", f"cannot import {spec}"):
        from . import api

        dynamic_shapes = dynamic_dims(dynamic)
        if dynamic_shapes and spec.kind == "onnx":
            raise CLIError("--dynamic-dim applies to torch MODELs; an ONNX file keeps the "
                           "symbolic dims it was exported with")
        if spec.kind == "onnx":
            try:
                return api.from_onnx(str(spec.path))
            except ValueError as err:   # the importer's messages start with the file's name
                msg = _one_line(err)
                raise CLIError(f"cannot import {msg}" if msg.startswith(str(spec.path))
                               else f"cannot import {spec}: {msg}") from err
        if spec.kind != "checkpoint":
            model, example = _call_factory(spec, length)
            return api.from_torch(model, example, dynamic_shapes=dynamic_shapes)
        with quiet_transformers(steps.debug):
            model, example = _load_checkpoint(spec, length)
            return api.from_torch(model, example, dynamic_shapes=dynamic_shapes)
