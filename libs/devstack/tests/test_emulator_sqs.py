"""An SQS long poll on the emulator waits as SQS's does: other requests are served meanwhile, and
a message sent while it waits ends it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from aegis_devstack.testing.holds import Holds
from aegis_storage.clients import AwsConfig, open_client

pytestmark = pytest.mark.integration


@pytest.fixture
async def sqs(private_emulator: str) -> AsyncIterator[Any]:
    async with open_client("sqs", AwsConfig(endpoint_url=private_emulator)) as client:
        yield client


async def test_a_long_poll_lets_others_be_served_and_takes_the_message_sent_while_it_waits(
    sqs: Any, private_emulator: str
) -> None:
    """The poll is held at the emulator until it has arrived, then released into its wait of
    20 s; meanwhile another queue is made and a message sent, and the poll answers with it.
    (moto waits inside the request: under the emulator's one-request-at-a-time lock, both
    requests would have waited out the 20 s, and the poll would have answered nothing.)"""
    queue = (await sqs.create_queue(QueueName="long-poll"))["QueueUrl"]
    holds = Holds(private_emulator)
    holds.arm("poll", "sqs", "ReceiveMessage", contains=["long-poll"])
    poll = asyncio.create_task(sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=20))
    await holds.held("poll", within=10)
    holds.release("poll")  # into its wait (the next request needs a round trip first)
    await sqs.create_queue(QueueName="made-while-it-waits")
    assert not poll.done()  # still waiting: nothing ends it before a message
    await sqs.send_message(QueueUrl=queue, MessageBody="sent while it waits")
    answer = await asyncio.wait_for(poll, 10)
    assert [m["Body"] for m in answer["Messages"]] == ["sent while it waits"]
