"""The container image's recipe, read without building it (building needs
root, podman and the package index: deploy/container/smoke.sh builds the
image and checks it end to end)."""

from __future__ import annotations

import re

from tests.conftest import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _instructions(name: str) -> list[str]:
    return re.findall(rf"^{name} (.+)$", DOCKERFILE, re.M)


def test_the_image_serves_the_bundled_models_with_the_console_script() -> None:
    assert _instructions("ENTRYPOINT") == ['["deadline-serve", "serve"]']
    assert _instructions("EXPOSE") == ["8000 8001"]
    assert "HOST=0.0.0.0" in DOCKERFILE and "GRPC_PORT=8001" in DOCKERFILE
    assert "ensure_bundled_models" in DOCKERFILE  # built at build time, not at each start
    assert _instructions("USER") == ["deadline-serve"]  # not root


def test_only_the_package_goes_into_the_image() -> None:
    copied = [line.split()[:-1] for line in _instructions("COPY")]
    assert copied == [["pyproject.toml", "README.md"], ["app"]]
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") :][:4] == ["*", "!pyproject.toml", "!README.md", "!app/"]


def test_the_cuda_variant_swaps_onnx_runtime_for_its_gpu_build() -> None:
    assert 'ARG EXTRAS=""' in DOCKERFILE
    assert '"/src${EXTRAS:+[$EXTRAS]}"' in DOCKERFILE
    gpu = DOCKERFILE.split('if [ "$EXTRAS" = "gpu" ]', 1)[1].split("fi", 1)[0]
    assert "pip uninstall -y onnxruntime" in gpu and "onnxruntime-gpu" in gpu
