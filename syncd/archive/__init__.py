"""Keeping the archive: ``compact`` (segments into packs and a snapshot manifest, with
``packer``), ``prune`` by the ``retention`` policy, ``verify``; ``options`` turns
settings into their options."""
