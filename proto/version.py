"""kembed's version as installed (pyproject.toml's `version`, read from the package's metadata): what
the gateway's /info and OpenAPI document and the worker's Info report."""

from importlib import metadata


def _installed() -> str:
    try:
        return metadata.version("kembed")
    except metadata.PackageNotFoundError:  # run from a tree that was never installed
        return "0+unknown"


VERSION = _installed()
