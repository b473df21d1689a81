"""Where transcripts hold what looks like a secret (``syncd secrets``)."""
