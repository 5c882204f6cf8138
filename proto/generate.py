"""Generate the Python stubs of the gateway<->worker contract (`make proto`).

The .proto is staged as `kembed/proto/embedder.proto` so that the generated gRPC module imports
`kembed.proto.embedder_pb2` absolutely, which is where the stubs live once installed. Run as
`python -m kembed.proto.generate [OUT_DIR]`; tests call `generate(tmp)` to check the committed
stubs are not stale. Needs grpcio-tools (a dev dependency); nothing at run time imports this.
"""

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = ("embedder.proto",)
GENERATED = ("embedder_pb2.py", "embedder_pb2.pyi", "embedder_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Write the generated stubs into out_dir and return their paths."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "kembed" / "proto"
        staged.mkdir(parents=True)
        for name in SOURCES:
            shutil.copy(HERE / name, staged / name)
        args = [
            "grpc_tools.protoc",
            f"-I{tmp}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *(str(Path("kembed/proto") / name) for name in SOURCES),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        out_dir.mkdir(parents=True, exist_ok=True)
        return [Path(shutil.copy(staged / name, out_dir / name)) for name in GENERATED]


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(f"wrote {path}")
