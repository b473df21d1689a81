"""Reading a backup back: ``restorer`` (select, fetch, place), ``remap`` (paths of
another machine), ``merge`` (a backed-up file meets a local one), ``install`` (atomic
writes), ``listing`` (machines and sessions tables, session lookup)."""
