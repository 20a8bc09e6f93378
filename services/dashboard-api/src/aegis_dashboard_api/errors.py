"""The dashboard's refusals: an :class:`ApiError` is answered as ``{"error", "message"}`` with
its status (401 with ``WWW-Authenticate: Bearer``)."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error, self.message = status, error, message
