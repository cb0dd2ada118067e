"""Finding and running the LLVM/MLIR 22 tools, with errors that say what to do.

Search order per tool: ``$SCANWEAVER_MLIR_BIN``, then ``PATH`` (plain and ``-22`` names), then
``/usr/lib/llvm-22/bin``.  A tool of another major version is skipped: IRDL syntax and pass
options changed between releases.  A failing ``mlir-opt`` raises ``MlirError`` quoting the
diagnostic and the offending input lines, because generated IR has no file to open.
"""
import functools
import os
import re
import shutil
import subprocess

VERSION = 22
DEFAULT_DIR = f"/usr/lib/llvm-{VERSION}/bin"
INSTALL_HINT = f"apt-get install mlir-{VERSION}-tools llvm-{VERSION} (or `make setup`)"


class MlirToolsMissing(RuntimeError):
    """An LLVM/MLIR tool of version 22 (or ptxas) could not be found."""


class MlirError(RuntimeError):
    """A tool rejected generated IR; the message quotes the diagnostic and the IR lines."""


def _version_ok(path):
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return False
    match = re.search(r"version (\d+)\.", out)
    return bool(match) and int(match.group(1)) == VERSION


@functools.lru_cache(maxsize=None)
def _find_cached(name, env_dir, path_env):
    candidates = []
    if env_dir:
        candidates += [os.path.join(env_dir, name), os.path.join(env_dir, f"{name}-{VERSION}")]
    else:
        for n in (name, f"{name}-{VERSION}"):
            found = shutil.which(n, path=path_env)
            if found:
                candidates.append(found)
        candidates.append(os.path.join(DEFAULT_DIR, name))
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK) and _version_ok(c):
            return c
    where = f"$SCANWEAVER_MLIR_BIN={env_dir}" if env_dir else f"PATH or {DEFAULT_DIR}"
    raise MlirToolsMissing(f"{name} (LLVM/MLIR {VERSION}) not found in {where}; install it: {INSTALL_HINT}")


def find(name):
    """Path of tool ``name`` (``mlir-opt``, ``mlir-translate``, ``llc``) of version 22."""
    return _find_cached(name, os.environ.get("SCANWEAVER_MLIR_BIN", ""), os.environ.get("PATH", ""))


def ptxas():
    path = shutil.which("ptxas") or ("/usr/local/cuda/bin/ptxas" if os.path.exists("/usr/local/cuda/bin/ptxas") else None)
    if not path:
        raise MlirToolsMissing("ptxas (CUDA toolkit) not found on PATH or in /usr/local/cuda/bin")
    return path


def cuda_root():
    """The CUDA toolkit directory (for libdevice), from ptxas's location or the usual path."""
    for root in (os.environ.get("CUDA_ROOT"), os.path.dirname(os.path.dirname(os.path.realpath(ptxas()))),
                 "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "nvvm", "libdevice")):
            return root
    raise MlirToolsMissing("CUDA libdevice (nvvm/libdevice/libdevice.10.bc) not found next to ptxas")


@functools.lru_cache(maxsize=1)
def version_key():
    """Identifies the toolchain for build caches."""
    return subprocess.run([find("mlir-opt"), "--version"], capture_output=True, text=True).stdout.strip()


def quote_lines(text, diagnostic, context=2):
    """The input lines a diagnostic points at (``<stdin>:LINE:COL``), numbered."""
    lines = text.splitlines()
    wanted = sorted({int(m.group(1)) for m in re.finditer(r"(?:<stdin>|\.mlir):(\d+):\d+", diagnostic)})
    out = []
    for n in wanted[:4]:
        for i in range(max(1, n - context), min(len(lines), n + context) + 1):
            out.append(f"{'>' if i == n else ' '}{i:5d} | {lines[i - 1]}")
        out.append("      ...")
    return "\n".join(out)


def mlir_opt(text, args, what="IR", env=None):
    """Run ``mlir-opt`` on IR text; returns its output or raises ``MlirError``."""
    proc = subprocess.run([find("mlir-opt"), *args, "-"], input=text, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        diag = proc.stderr.strip()
        raise MlirError(f"mlir-opt {' '.join(args)} rejected the {what}:\n{diag[:4000]}\n"
                        f"offending lines of the {what}:\n{quote_lines(text, diag)}")
    return proc.stdout


def mlir_translate(text):
    proc = subprocess.run([find("mlir-translate"), "--mlir-to-llvmir", "-"], input=text,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise MlirError(f"mlir-translate rejected the LLVM dialect module:\n{proc.stderr[:4000]}\n"
                        f"{quote_lines(text, proc.stderr)}")
    return proc.stdout


def llc_object(llvm_ir, obj_path):
    proc = subprocess.run([find("llc"), "-O3", "-relocation-model=pic", "-filetype=obj", "-", "-o", obj_path],
                          input=llvm_ir, capture_output=True, text=True)
    if proc.returncode != 0:
        raise MlirError(f"llc failed:\n{proc.stderr[:4000]}")

