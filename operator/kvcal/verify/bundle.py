"""The verifier as one zip file that runs in a stock vLLM image: `python3 kvcal-verifier.pyz CHECKPOINT_DIR --runtime`.

The verification Job must load the checkpoint in the baseline's own vLLM (the proof is that THIS vLLM loads the
scales), and platform teams serve from the unmodified vllm/vllm-openai image, which has no kvcal. So an init
container in the calibrator image runs `python -m kvcal.verify.bundle DIR` and writes the bundle into an emptyDir;
the verifier container runs it with the image's own python3, vLLM and torch.

The bundle holds `kvcal.verify.cli` and every kvcal module it imports (found by reading their imports, so a new
import is bundled without a list to maintain), nothing else: those use only the standard library and, for
--runtime, vLLM. Put the bundle on PYTHONPATH too: `LLM.apply_model(read_kv_scales)` pickles the function by
reference, and vLLM's worker processes must import `kvcal.verify.readback` from the same file."""

import argparse
import ast
import hashlib
import os
import sys
import zipfile
from pathlib import Path

BUNDLE_NAME = "kvcal-verifier.pyz"
ENTRY_MODULE = "kvcal.verify.cli"
# What `python3 kvcal-verifier.pyz ARGS` runs: the zip's top-level __main__.py.
MAIN = "import sys\n\nfrom kvcal.verify.cli import main\n\nsys.exit(main())\n"
# A fixed timestamp: the same sources make the same bytes, so the bundle's sha256 names the verifier's code.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the kvcal package


def _source(module: str) -> Path:
    base = _PACKAGE_ROOT.joinpath(*module.split("."))
    package = base / "__init__.py"
    return package if package.is_file() else base.with_suffix(".py")


def _is_module(module: str) -> bool:
    return _source(module).is_file()


def _kvcal_imports(path: Path, module: str) -> set[str]:
    """The kvcal modules `path` imports anywhere (function-local imports too, as runtime.py's)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            found.add(base)
            # `from kvcal.verify import static` imports the module kvcal.verify.static
            found.update(f"{base}.{alias.name}" for alias in node.names if _is_module(f"{base}.{alias.name}"))
    return {name for name in found if name == "kvcal" or name.startswith("kvcal.")}


def bundled_modules(entry: str = ENTRY_MODULE) -> list[str]:
    """`entry`, every kvcal module it imports (transitively), and their packages' __init__ modules, sorted."""
    modules: set[str] = set()
    pending = [entry]
    while pending:
        module = pending.pop()
        if module in modules:
            continue
        if not _is_module(module):
            raise FileNotFoundError(f"{module}: no source under {_PACKAGE_ROOT} (the bundle needs kvcal's .py files)")
        modules.add(module)
        parts = module.split(".")
        pending += [".".join(parts[:n]) for n in range(1, len(parts))]  # a module's packages are imported first
        pending += sorted(_kvcal_imports(_source(module), module))
    return sorted(modules)


def build_bundle(dest: Path) -> Path:
    """Writes DEST/kvcal-verifier.pyz (DEST is created) and returns its path. The file appears whole or not at
    all: written beside it, then renamed."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / BUNDLE_NAME
    partial = dest / f".{BUNDLE_NAME}.partial"
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        for name, data in [("__main__.py", MAIN.encode())] + [
            (_source(m).relative_to(_PACKAGE_ROOT).as_posix(), _source(m).read_bytes()) for m in bundled_modules()
        ]:
            info = zipfile.ZipInfo(name, _ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            bundle.writestr(info, data)
    os.replace(partial, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvcal.verify.bundle",
        description=f"Write {BUNDLE_NAME}: the verifier for a stock vLLM image (python3 {BUNDLE_NAME} CHECKPOINT_DIR "
        "--runtime), with PYTHONPATH set to the file so vLLM's workers import it too.",
    )
    parser.add_argument("dest", type=Path, metavar="DIR", help="folder to write the bundle into (created)")
    args = parser.parse_args(argv)
    path = build_bundle(args.dest)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    print(f"{path}: {len(bundled_modules())} modules, {path.stat().st_size} bytes, sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
