"""``deepspec env [--json]``: what a bug report needs to say about this machine.

Prints the versions of Python, ``deepspec_train`` and the libraries training runs on, whether CUDA is available,
the CUDA version torch was built with and the name of every visible device, and the platform; ``--json`` gives
the same as one JSON object for scripts. Library versions are read from the installed distributions' metadata,
so a library that fails to import is still reported; torch is imported only for what its metadata cannot say
(CUDA and the devices).
"""

from __future__ import annotations

import argparse
import json
import platform
from importlib import metadata
from typing import Any

from deepspec_train.common.package_version import package_version

LIBRARIES = ("torch", "transformers", "accelerate", "deepspeed", "tokenizers", "safetensors")
NOT_INSTALLED = "not installed"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of aligned lines")


def installed_version(distribution: str) -> str:
    """The installed version of ``distribution``, or ``not installed``."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return NOT_INSTALLED


def cuda_report() -> dict[str, Any]:
    """Whether CUDA is usable, the CUDA version torch was built with (None for a CPU build) and the devices."""
    try:
        import torch
    except ImportError:
        return {"available": False, "version": None, "devices": []}
    available = torch.cuda.is_available()
    devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if available else []
    return {"available": available, "version": torch.version.cuda, "devices": devices}


def environment_report() -> dict[str, Any]:
    return {
        "deepspec_train": package_version(),
        "python": platform.python_version(),
        "libraries": {name: installed_version(name) for name in LIBRARIES},
        "cuda": cuda_report(),
        "platform": platform.platform(),
    }


def format_report(report: dict[str, Any]) -> str:
    """``report`` as ``name  value`` lines, names aligned."""
    cuda = report["cuda"]
    devices = [f"{i}: {name}" for i, name in enumerate(cuda["devices"])]
    rows = [
        ("deepspec_train", report["deepspec_train"]),
        ("python", report["python"]),
        *report["libraries"].items(),
        ("CUDA available", "yes" if cuda["available"] else "no"),
        ("CUDA version", cuda["version"] or "none"),
        ("devices", ", ".join(devices) or "none"),
        ("platform", report["platform"]),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def run(args: argparse.Namespace) -> int:
    report = environment_report()
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0
