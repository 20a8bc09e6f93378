"""Root conftest: every test gets the real-infrastructure fixtures of aegis_devstack.testing,
and the end-to-end files are handed out first. Fixtures that build one service's settings for
tests of several packages live here too (``ingest_settings``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from aegis_ingest.settings import IngestSettings

if TYPE_CHECKING:  # the plugin module is imported by pytest (its asserts rewritten), not here
    from aegis_devstack.testing.storage import Foundation

pytest_plugins = [
    "aegis_devstack.testing.fixtures",
    "aegis_devstack.testing.hygiene",
    "aegis_devstack.testing.natsbus",
    "aegis_devstack.testing.storage",
    "aegis_devstack.testing.webhook",
]

# files that take minutes on one worker (whole stacks started, killed, restarted; a Terraform
# apply; a NATS cluster partitioned; the emulator's memory measured): handed out first, so
# that neither worker is left with one of them while the other has nothing left to do; and in
# this order, so that what computes runs beside what waits: the first two go to two workers at
# once (the `aegis up` runs compute while the AWS provider waits a minute for the lifecycle
# rules), the third (the pipeline's processes) and the fourth (the cluster's elections) to
# whichever worker is free next. Handed out in collection order instead, the cluster's
# elections came beside the provider's wait, and both cores idled for a minute and a half.
FIRST = (
    "tests/e2e/test_make_run.py",
    "tests/integration/test_terraform.py",
    "tests/e2e/test_pipeline.py",
    "tests/integration/test_nats_cluster.py",
    "libs/devstack/tests/test_emulator_memory.py",
    "tests/e2e/",
)


def _handed_out(item: pytest.Item, root: str) -> int:
    """Where ``item``'s file comes in :data:`FIRST` (its first matching entry), or after."""
    path = str(item.path).removeprefix(root)
    return next((i for i, prefix in enumerate(FIRST) if path.startswith(prefix)), len(FIRST))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of :data:`FIRST` first, in its order, then the rest in collection order: a test
    file runs on one worker, so a file of minutes handed out last keeps one worker busy while
    the other has nothing left (it made the suite minutes longer). The Makefile tells
    pytest-xdist to keep this order (--no-loadscope-reorder: by default it hands out the files
    with the most tests first, and an end-to-end file has few)."""
    root = str(items[0].config.rootpath) + "/" if items else ""
    items.sort(key=lambda item: _handed_out(item, root))


@pytest.fixture
def ingest_settings(
    foundation: Foundation, aws_endpoint: str, mqtt_url: str, nats_url: str, unique_id: str
) -> IngestSettings:
    """The real ingest's settings for this test: its own bucket, service name (dead letters on
    ``aegis.dlq.ingest-{id}.*``), client id and share group, on the session's servers."""
    return IngestSettings(
        service=f"ingest-{unique_id}",
        aws_endpoint_url=aws_endpoint,
        bucket=foundation.bucket,
        mqtt_url=mqtt_url,
        nats_url=nats_url,
        mqtt_client_id=f"ingest-{unique_id}",
        mqtt_share_group=f"g-{unique_id}",
        # short-lived sessions: a test's session must not queue the machine's traffic for an hour
        mqtt_session_expiry_s=60,
        mqtt_reconnect_min_s=0.05,
        mqtt_reconnect_max_s=0.5,
        ingest_retry_attempts=2,
        ingest_retry_first_delay_s=0.05,
        ingest_retry_max_delay_s=0.1,
        ingest_shutdown_grace_s=5,
        health_port=0,
    )
