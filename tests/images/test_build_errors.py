"""A build that fails says which image and which Dockerfile step broke (a broken copy of the operator's Dockerfile)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvcal.devenv.images import IMAGES, ImageBuildError
from tests.support.oci import Podman

pytestmark = pytest.mark.images
BROKEN_STEP = "RUN /opt/kvcal/bin/pip install ./no-such-folder"


def broken_operator_dockerfile(folder: Path) -> Path:
    original = IMAGES["operator"].dockerfile()
    text = original.read_text()
    assert "RUN /opt/kvcal/bin/pip install ." in text
    broken = folder / "Dockerfile"
    broken.write_text(text.replace("RUN /opt/kvcal/bin/pip install .", BROKEN_STEP, 1))
    shutil.copy(original.with_name("Dockerfile.dockerignore"), folder / "Dockerfile.dockerignore")
    return broken


def test_a_failed_build_names_the_image_and_the_step(podman: Podman, tmp_path: Path) -> None:
    with pytest.raises(ImageBuildError) as failure:
        podman.build("operator", dockerfile=broken_operator_dockerfile(tmp_path))
    error = failure.value
    assert error.image == "operator"
    assert error.step is not None and BROKEN_STEP in error.step, error.step
    message = str(error)
    assert message.startswith("image operator: build failed at [1/2] STEP "), message
    assert "no-such-folder" in "\n".join(error.tail)  # pip's own complaint is in the tail


def test_the_cli_refuses_an_unknown_image() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvcal.devenv.images", "build", "operatr"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "unknown image(s) operatr" in proc.stderr
