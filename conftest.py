"""Root conftest: every test gets the real-infrastructure fixtures of aegis_devstack.testing."""

pytest_plugins = [
    "aegis_devstack.testing.fixtures",
    "aegis_devstack.testing.hygiene",
    "aegis_devstack.testing.natsbus",
    "aegis_devstack.testing.oidc",
    "aegis_devstack.testing.storage",
    "aegis_devstack.testing.webhook",
]
