"""Running as a service: ``daemon`` (the loop), ``catchup`` (a start-up backlog in a
child process), ``schedule`` (the archive jobs), ``notify`` (sd_notify), ``metrics``,
``status``, ``log``, ``signals``."""
