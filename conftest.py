"""Root conftest: every test gets the real-infrastructure fixtures of aegis_runtime.testing."""

pytest_plugins = [
    "aegis_runtime.testing.fixtures",
    "aegis_runtime.testing.natsbus",
    "aegis_runtime.testing.storage",
    "aegis_runtime.testing.webhook",
]
