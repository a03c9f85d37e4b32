"""Payload transport for Kubernetes: compress, cut into Secret-sized chunks, and back.

The worker runtime reads a directory of chunk files `payload-000`, `payload-001`, ... whose
concatenation (in name order) is the zlib-compressed payload (`runtime/payload.py`). This
module is the sending half and must stay importable without the Kubernetes client.

Sizes:
- A Secret's data may hold at most 1 MiB (the API server's MaxSecretSize, counted on the
  decoded bytes), and etcd refuses requests above 1.5 MiB by default (`--max-request-bytes`).
- In the JSON request the data is base64, 4/3 larger. A 768 KiB chunk is exactly 1 MiB of
  base64, so each Secret is ~1 MiB on the wire (the API server takes up to 3 MiB of JSON) and
  ~768 KiB in etcd (stored as protobuf bytes, not base64), leaving a quarter of MaxSecretSize
  and about half of etcd's limit for metadata, managedFields and encryption-at-rest overhead.
- Chunk names carry three digits so that name order is chunk order (the runtime sorts
  names); that and etcd's health put a ceiling on the total: MAX_CHUNKS chunks (~96 MiB
  compressed). Bigger data belongs on a shared volume, not in etcd.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

CHUNK_SIZE = 768 * 1024
MAX_CHUNKS = 128
MAX_COMPRESSED_BYTES = CHUNK_SIZE * MAX_CHUNKS
CHUNK_PREFIX = "payload-"
# Level 1: on this kind of data (pickled arrays, mostly incompressible) higher levels cost
# more time than they save bytes; source code still shrinks several times at level 1.
COMPRESS_LEVEL = 1


class PayloadTooLarge(ValueError):
    """The compressed payload does not fit the Secrets we are willing to put in etcd."""


def chunk_name(index: int) -> str:
    """The file name (and Secret key) of chunk `index`: payload-000, payload-001, ..."""
    return f"{CHUNK_PREFIX}{index:03d}"


def split_payload(data: bytes) -> list[bytes]:
    """zlib-compress `data` and cut it into chunks of at most CHUNK_SIZE bytes.

    The concatenation of the chunks is `zlib.compress(data)`; an empty payload still gives
    one (non-empty) chunk, so there is always something to mount. Compresses in slices and
    stops as soon as the limit is crossed, so a far too large payload fails fast.
    """
    compressor = zlib.compressobj(COMPRESS_LEVEL)
    parts: list[bytes] = []
    size = 0
    view = memoryview(data)
    for start in range(0, len(view), CHUNK_SIZE):
        part = compressor.compress(view[start : start + CHUNK_SIZE])
        parts.append(part)
        size += len(part)
        if size > MAX_COMPRESSED_BYTES:
            _too_large(len(data))
    parts.append(compressor.flush())
    compressed = b"".join(parts)
    if len(compressed) > MAX_COMPRESSED_BYTES:
        _too_large(len(data))
    return [compressed[i : i + CHUNK_SIZE] for i in range(0, len(compressed), CHUNK_SIZE)]


def _too_large(raw_size: int) -> None:
    raise PayloadTooLarge(
        f"the code and pushed variables ({raw_size / 2**20:.1f} MiB) are more than "
        f"{MAX_COMPRESSED_BYTES / 2**20:.0f} MiB after compression, the most a Kubernetes job "
        "takes. Push less data (load large data inside the job from shared storage instead)."
    )


def join_payload(chunks: Iterable[bytes]) -> bytes:
    """The inverse of split_payload: concatenate in order and decompress."""
    return zlib.decompress(b"".join(chunks))
