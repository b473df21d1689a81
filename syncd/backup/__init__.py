"""The backup path: ``watch`` and ``scan`` find what changed, ``ship`` makes it durable
as segments, ``state`` remembers what the store confirmed, ``engine`` holds what one
flush needs (shared by the daemon and ``syncd sync``), ``errorlog`` keeps recent errors.
"""
