"""Seeds: one protocol seed, independent reproducible streams for every purpose.

`derive_seed(seed, "tiny-decoder", 3, "pca", 8, "normal")` names the stream that draws layer 3's
rank-8 normal controls of that model; changing anything else in the protocol never changes it.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any labels: the first 8 bytes of sha256(repr(parts)), little-endian."""
    digest = hashlib.sha256(repr(parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)
