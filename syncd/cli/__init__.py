"""The ``syncd`` command line: ``main`` (the group, run, sync, status, and the one place
errors become exit codes), ``restore`` (machines, sessions, restore, resume),
``archive`` (compact, prune, verify), ``keys`` (init, key, check-store), ``util``."""
