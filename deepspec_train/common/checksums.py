"""Content checksums of files: the token cache key hashes every input file, checkpoint manifests every file.

SHA-256 (hardware-accelerated on current x86 and ARM server CPUs), read in 1 MiB chunks into one reused buffer,
so memory stays flat for files of any size; ``hashlib`` releases the GIL while it hashes. The cost is one extra
read of each file: ``bench/integrity_cost.py`` prints the rate on the machine it runs on, next to the rate of
writing the same bytes.
"""

from __future__ import annotations

import hashlib
import os

ALGORITHM = "sha256"
CHUNK_BYTES = 1 << 20


def file_checksum(path: str | os.PathLike) -> str:
    """Hex SHA-256 of the file's bytes."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while size := handle.readinto(buffer):
            digest.update(view[:size])
    return digest.hexdigest()
