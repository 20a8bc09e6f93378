"""Test helpers for AEGIS: the pytest plugin in :mod:`aegis_devstack.testing.fixtures`.

Register it once from the repository's root ``conftest.py``:
``pytest_plugins = ["aegis_devstack.testing.fixtures"]``.
"""
