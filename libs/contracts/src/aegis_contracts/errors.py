"""The contracts' one exception: :class:`ContractError`, raised for any input the contract refuses.

It subclasses ``ValueError`` so that pydantic validators turn it into a ``ValidationError``
naming the field. ``code`` is a stable snake_case word for metrics and dead-letter reasons.
"""

from __future__ import annotations


class ContractError(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
