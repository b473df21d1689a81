"""One session's pages (rendered transcript, points in time, restore, resume,
conflicts): mounted by the app from ``routes``."""

from __future__ import annotations

from starlette.routing import BaseRoute

routes: list[BaseRoute] = []
