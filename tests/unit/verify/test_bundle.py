"""The verifier bundle (kvcal.verify.bundle): what goes in, and that it needs nothing a stock vLLM image lacks."""

import ast
import sys
import zipfile
from pathlib import Path

from kvcal.verify import bundle

# A stock vllm/vllm-openai image has python3, vLLM and vLLM's own dependencies (torch, transformers and
# compressed-tensors among them: vLLM requires all three); kvcal is not installed.
STOCK_IMAGE_MODULES = {"vllm", "torch", "transformers", "compressed_tensors"}


def test_bundle_holds_the_verifier_and_only_it(tmp_path: Path) -> None:
    path = bundle.build_bundle(tmp_path / "out")
    assert path == tmp_path / "out" / "kvcal-verifier.pyz"
    with zipfile.ZipFile(path) as archive:
        names = sorted(archive.namelist())
        assert archive.read("__main__.py").decode() == bundle.MAIN
    assert names == [
        "__main__.py",
        "kvcal/__init__.py",
        "kvcal/calibrator/__init__.py",  # --data: the calibrator's taps and prompt reading, in the image's torch
        "kvcal/calibrator/data.py",
        "kvcal/calibrator/quant.py",
        "kvcal/calibrator/taps.py",
        "kvcal/verify/__init__.py",
        "kvcal/verify/cli.py",
        "kvcal/verify/data.py",
        "kvcal/verify/digest.py",
        "kvcal/verify/names.py",
        "kvcal/verify/problems.py",
        "kvcal/verify/readback.py",  # imported inside runtime.read_back(): vLLM's workers unpickle it from here
        "kvcal/verify/runtime.py",
        "kvcal/verify/static.py",
        "kvcal/verify/tensors.py",
    ]
    assert not list((tmp_path / "out").glob(".*partial"))


def test_bundled_modules_import_only_the_standard_library_and_vllm(tmp_path: Path) -> None:
    with zipfile.ZipFile(bundle.build_bundle(tmp_path)) as archive:
        sources = {name: archive.read(name).decode() for name in archive.namelist()}
    outside: set[str] = set()
    for name, source in sources.items():
        for node in ast.walk(ast.parse(source, name)):
            if isinstance(node, ast.Import):
                outside.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                outside.add(node.module.split(".")[0])
    assert outside - set(sys.stdlib_module_names) - {"kvcal"} <= STOCK_IMAGE_MODULES, outside


def test_same_sources_make_the_same_bundle(tmp_path: Path) -> None:
    """The init container's log prints the bundle's sha256: it identifies the verifier's code."""
    first = bundle.build_bundle(tmp_path / "a").read_bytes()
    assert bundle.build_bundle(tmp_path / "b").read_bytes() == first
    assert bundle.build_bundle(tmp_path / "a").read_bytes() == first  # rewritten in place
