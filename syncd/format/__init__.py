"""The on-store format (docs/FORMAT.md), pure: bytes in, bytes out, no store.

``segment`` (the container every object shares: frames, index, trailer; the writer and
the bounded decoders), ``snapshot`` (manifests and their groups), ``catalog`` (the
session fields an index carries), ``fold`` (indexes folded into files), ``dictionary``
(the trained zstd dictionary).
"""
