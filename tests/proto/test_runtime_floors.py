"""pip's floors for grpcio and protobuf are the versions the committed stubs demand: the stubs
refuse to import under an older grpcio (embedder_pb2_grpc.py's GRPC_GENERATED_VERSION) or protobuf
(embedder_pb2.py's ValidateProtobufRuntimeVersion, same major, at least the gencode's), so a looser
floor lets pip install a kembed that cannot start."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from kembed.proto import embedder_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"].values()
    listed = project["dependencies"] + [r for extra in extras for r in extra]
    return {req.name: req for req in map(Requirement, listed) if req.name in ("grpcio", "protobuf")}


def test_grpcio_floor_is_the_generated_stubs_version():
    needed = Version(embedder_pb2_grpc.GRPC_GENERATED_VERSION)
    spec = _requirements()["grpcio"].specifier
    assert Version(str(needed)) in spec
    assert not any(s.operator == ">=" and Version(s.version) < needed for s in spec), spec


def test_protobuf_range_is_the_generated_stubs_major_from_their_version():
    source = (ROOT / "proto" / "embedder_pb2.py").read_text()
    major, minor, patch = map(int, re.search(r"Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", source).groups())
    needed = Version(f"{major}.{minor}.{patch}")
    spec = _requirements()["protobuf"].specifier
    assert needed in spec
    assert not any(s.operator == ">=" and Version(s.version) < needed for s in spec), spec
    assert Version(f"{major + 1}.0.0") not in spec, f"protobuf {major + 1} runs no {major}.x gencode: {spec}"
