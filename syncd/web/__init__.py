"""The local web page: dashboard, sessions, one session; loopback only, token-guarded."""
