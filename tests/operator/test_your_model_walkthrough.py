"""docs/your-model.md, step by step on the bundled model, with the commands and YAML read from the
doc itself so the two cannot drift: check-model as written; the safetensors conversion and the
tokenizer.json snippet run; the weights image built without Docker (its Dockerfile and
.dockerignore read and applied to a model directory) and mounted where the operator mounts an image
source; the EmbeddingModels valid against the CRD; the PVC and copy Job valid Kubernetes that fill
the directory the PVC example names."""

from __future__ import annotations

import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import torch
import transformers
import yaml
from operator_fakes import REPO
from test_crd_schema import errors

from kembed.operator.build.manifests import MODEL_MOUNT, model_mount, model_volume
from kembed.operator.spec.spec import parse_spec
from kembed.worker.config import bundled_model_dir
from kembed.worker.tools.check_model import check

DOC = (REPO / "docs" / "your-model.md").read_text()
BUNDLED = bundled_model_dir()
USER_DIR = "./my-model"  # the directory the doc's commands name


def bash_commands() -> list[list[str]]:
    """Every command of the doc's bash blocks (heredoc bodies skipped), as argument lists."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", DOC, re.S):
        block = re.sub(r"<<'EOF'\n.*?\nEOF\n", "\n", block, flags=re.S)
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


COMMANDS = bash_commands()


def commands(*prefix: str) -> list[list[str]]:
    return [words for words in COMMANDS if words[: len(prefix)] == list(prefix)]


def example(relative: str) -> dict:
    return yaml.safe_load((REPO / relative).read_text())


def applied_files() -> list[str]:
    return [words[words.index("-f") + 1] for words in commands("kubectl") if "apply" in words]


def test_the_doc_has_its_steps():
    assert len([w for w in COMMANDS if w[1:2] == ["check-model"]]) == 2
    assert len(commands("docker", "build")) == 1
    assert applied_files() == [
        "charts/kembed/examples/your-model-image.yaml",
        "docs/your-model/copy-to-pvc.yaml",
        "charts/kembed/examples/your-model-pvc.yaml",
    ]


@pytest.mark.parametrize("words", [w for w in COMMANDS if w[1:2] == ["check-model"]], ids=" ".join)
def test_check_model_as_written_passes_on_the_bundled_model(words):
    assert words[0] == ".venv/bin/kembed-worker" and USER_DIR in words
    args = [str(BUNDLED) if word == USER_DIR else word for word in words[1:]]
    done = subprocess.run(
        [sys.executable, "-P", "-m", "kembed.worker", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    shown = re.search(r"```text\n(.*?)```", DOC, re.S)
    assert shown is not None
    for line in shown.group(1).splitlines():  # the doc's sample output is the real output, line for line
        assert line in done.stdout.splitlines(), line


def tiny_pickled_bert(path: Path) -> None:
    model = transformers.BertModel(
        transformers.BertConfig(
            vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
        ),
        add_pooling_layer=False,
    )
    model.config.save_pretrained(path)
    torch.save(model.state_dict(), path / "pytorch_model.bin")
    shutil.copy(BUNDLED / "tokenizer.json", path)


def test_the_conversion_snippet_makes_pickled_weights_servable(tmp_path):
    tiny_pickled_bert(tmp_path)
    assert "pytorch_model.bin" in check(tmp_path).reason
    snippet = re.search(r"```bash\n(\S+) -P - \./my-model <<'EOF'\n(.*?)\nEOF\n```", DOC, re.S)
    assert snippet is not None and snippet.group(1) == ".venv/bin/python"
    done = subprocess.run(
        [sys.executable, "-P", "-", str(tmp_path)], input=snippet.group(2), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    result = check(tmp_path, load=True)
    assert result.is_servable, result.reason
    assert result.weight_files == ["pytorch_model.safetensors"]


def test_the_tokenizer_snippet_writes_a_tokenizer_json(tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(BUNDLED, model_dir)
    (model_dir / "tokenizer.json").unlink()
    assert "no tokenizer.json" in check(model_dir).reason
    line = re.search(r"`(\.venv/bin/python -P -c .*? \./my-model)`", DOC)
    assert line is not None
    words = shlex.split(line.group(1))
    done = subprocess.run(
        [sys.executable, *words[1:-1], str(model_dir)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert check(model_dir).is_servable


def dockerignore_patterns(path: Path) -> list[re.Pattern[str]]:
    """The .dockerignore's patterns as Docker matches them, for the forms it uses (`*`, `?`, a
    leading `**/`); a path is left out when it or a folder above it matches."""
    patterns = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assert re.fullmatch(r"(\*\*/)?[\w.*?-]+", line), f"this reader does not handle {line!r}"
        body = re.escape(line.removeprefix("**/")).replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        patterns.append(re.compile(("(?:.*/)?" if line.startswith("**/") else "") + body))
    return patterns


def build_image(dockerfile: Path, context: Path, root: Path) -> None:
    """What `docker build -f dockerfile context` puts in the image, written under `root`."""
    instructions = [
        line.split()
        for line in dockerfile.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert instructions == [["FROM", "scratch"], ["COPY", ".", "/"]]
    ignored = dockerignore_patterns(dockerfile.with_name(dockerfile.name + ".dockerignore"))
    for file in sorted(context.rglob("*")):
        parts = file.relative_to(context).parts
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if file.is_file() and not any(p.fullmatch(prefix) for p in ignored for prefix in prefixes):
            (root / "/".join(parts)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, root / "/".join(parts))


def test_the_weights_image_holds_the_model_where_the_operator_mounts_it(tmp_path):
    [build] = commands("docker", "build")
    dockerfile = REPO / build[build.index("-f") + 1]
    tag, context = build[build.index("-t") + 1], build[-1]
    assert context == USER_DIR
    # the directory as a download leaves it, with what the image must leave out
    user_dir = tmp_path / "my-model"
    shutil.copytree(BUNDLED, user_dir)
    for junk in (
        ".cache/huggingface/download/model.safetensors.metadata",
        "pytorch_model.bin",
        "onnx/model.onnx",
    ):
        (user_dir / junk).parent.mkdir(parents=True, exist_ok=True)
        (user_dir / junk).write_text("not for the image")
    root = tmp_path / "image"
    build_image(dockerfile, user_dir, root)
    assert not any((root / junk).exists() for junk in (".cache", "pytorch_model.bin", "onnx"))

    body = example("charts/kembed/examples/your-model-image.yaml")
    inline = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", DOC, re.S)]
    assert inline == [body]  # the doc shows the shipped example
    assert errors(body) == []
    source = parse_spec(body["spec"]).model.source
    assert model_volume(source)["image"]["reference"] == tag
    mount = model_mount(source)
    assert mount["mountPath"] == MODEL_MOUNT
    mounted = root / mount.get("subPath", "")  # what the pods see at /models/model
    result = check(mounted, load=True)
    assert result.verdict == check(BUNDLED).verdict, result.reason
    for path in [mounted, *mounted.rglob("*")]:  # readable by the pods' UID, which owns nothing here
        needed = stat.S_IROTH | (stat.S_IXOTH if path.is_dir() else 0)
        assert path.stat().st_mode & needed == needed, path


def test_the_pvc_job_fills_the_directory_the_pvc_example_mounts():
    objects = list(yaml.safe_load_all((REPO / "docs/your-model/copy-to-pvc.yaml").read_text()))
    for obj in objects:
        kubernetes_validate.validate(obj, "1.31.0", strict=True)
    claim, job = objects
    assert (claim["kind"], job["kind"]) == ("PersistentVolumeClaim", "Job")
    pod = job["spec"]["template"]["spec"]
    [volume] = pod["volumes"]
    [mount] = pod["containers"][0]["volumeMounts"]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert pod["securityContext"]["runAsUser"] == 10001
    [copy] = [w for w in commands("kubectl") if "cp" in w]
    assert copy[copy.index("cp") + 1] == USER_DIR
    target = copy[copy.index("cp") + 2].split(":", 1)[1]
    assert any(f"job-name={job['metadata']['name']}" in " ".join(w) for w in commands("kubectl"))

    body = example("charts/kembed/examples/your-model-pvc.yaml")
    assert errors(body) == []
    source = parse_spec(body["spec"]).model.source
    assert model_volume(source)["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert target == f"{mount['mountPath']}/{model_mount(source)['subPath']}"
