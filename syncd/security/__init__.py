"""Who may read and write: ``crypto`` (sealing, key files), ``keys`` (the store's
``keys/`` and passphrases), ``lease`` (one writer per machine), ``lock`` (one process
per state database)."""
