"""The three Dockerfiles, read statically (no Docker here to build them): each build gets every
package folder it needs, runs as the non-root UID the chart and the operator's pods assume, never
lets the source tree shadow the standard library, and keeps torch out of the CPU-only images."""

import re
import tomllib

import pytest
import yaml
from chart_tools import CHART_DIR, REPO_ROOT

from kembed.operator.spec.pod_spec import RUN_AS

IMAGES = ("gateway", "worker", "operator")
# the top-level folders holding the import packages (kembed.operator is operator/kembed_operator/)
PACKAGE_DIRS = sorted(
    {
        folder.split("/")[0]
        for folder in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
            "package-dir"
        ].values()
    }
)


def dockerfile(image: str) -> str:
    return (REPO_ROOT / image / "Dockerfile").read_text()


def final_stage(text: str) -> str:
    return text[text.rindex("\nFROM ") :]


@pytest.mark.parametrize("image", IMAGES)
def test_build_context_holds_every_package_folder(image):
    """pyproject declares every import package: building any image needs all their folders, in
    the Dockerfile's COPY lines and through its .dockerignore allow-list."""
    text = dockerfile(image)
    ignore = (REPO_ROOT / image / "Dockerfile.dockerignore").read_text().splitlines()
    for folder in PACKAGE_DIRS:
        assert re.search(rf"^COPY {folder} {folder}$", text, re.M), (
            f"{image}/Dockerfile does not copy {folder}/"
        )
        assert f"!{folder}/" in ignore, f"{image}/Dockerfile.dockerignore leaves out {folder}/"
    assert re.search(r"^COPY pyproject.toml README.md \./$", text, re.M)


@pytest.mark.parametrize("image", IMAGES)
def test_image_runs_as_the_uid_the_pods_expect(image):
    """The chart's operator pod and the operator's worker, gateway and Job pods all run as RUN_AS;
    files the image creates for its user (/models) must belong to that UID."""
    chart_uid = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["operator"]["podSecurityContext"][
        "runAsUser"
    ]
    assert chart_uid == RUN_AS
    stage = final_stage(dockerfile(image))
    assert re.search(rf"^USER {RUN_AS}:{RUN_AS}$", stage, re.M)
    assert f"--uid {RUN_AS} --gid {RUN_AS}" in stage


@pytest.mark.parametrize("image", IMAGES)
def test_image_starts_its_service_without_the_source_tree_on_sys_path(image):
    stage = final_stage(dockerfile(image))
    assert f'CMD ["python", "-P", "-m", "kembed.{image}"]' in stage
    assert "COPY --from=build /opt/kembed /opt/kembed" in stage
    assert not re.search(r"^COPY (?!--from)", stage, re.M), "the runtime stage copies sources"


@pytest.mark.parametrize("image", ["gateway", "operator"])
def test_cpu_images_install_their_extra_and_no_torch(image):
    text = dockerfile(image)
    # the gateway's pods fetch a Hub or S3 model's tokenizer with fetch-model (the fetch extra)
    assert f'pip install ".[{image}{",fetch" if image == "gateway" else ""}]"' in text
    assert "python:3.12-slim" in text
    assert '! /opt/kembed/bin/python -P -c "import torch"' in text


def test_worker_image_is_cuda_with_a_pinned_torch():
    text = dockerfile("worker")
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:[0-9.]+-runtime-ubuntu24\.04$", text, re.M)
    assert re.search(r"^ARG TORCH_VERSION=[0-9]+\.[0-9]+\.[0-9]+$", text, re.M)
    assert '"torch==${TORCH_VERSION}"' in text
    # torch first from PyTorch's CUDA index, then the worker extra (which must not replace it).
    assert text.index('"torch==${TORCH_VERSION}"') < text.index('pip install ".[worker,flash,fetch]"')
    assert "assert torch.version.cuda" in text
