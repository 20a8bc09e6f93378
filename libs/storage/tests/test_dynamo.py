"""The read model's DynamoDB item client, against a transport the test answers: what it sends,
what it retries and what it raises (against the emulator it is exercised by every read model
test)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from aiodynamo.credentials import Key
from aiodynamo.http.types import Request, RequestFailed, Response
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCredentials
from yarl import URL

from aegis_storage.clients import AwsConfig
from aegis_storage.dynamo import Signer, open_items
from aegis_storage.errors import Conflict, NotFound, StorageError, Transient, translated

ENDPOINT = "http://dynamodb.test:4566"
STATIC = {"aws_access_key_id": "AKIDTEST", "aws_secret_access_key": "secret"}


def error(status: int, code: str, **fields: Any) -> Response:
    body = {"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": code, **fields}
    return Response(status, json.dumps(body).encode())


def ok(body: dict[str, Any]) -> Response:
    return Response(200, json.dumps(body).encode())


@dataclass
class Transport:
    """Answers each request with the next of ``answers`` (a Response, or an exception to raise)."""

    answers: list[Response | Exception]
    sent: list[Request]

    async def __call__(self, request: Request) -> Response:
        self.sent.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def actions(self) -> list[str]:
        return [str((r.headers or {})["X-Amz-Target"]).split(".")[1] for r in self.sent]

    def payloads(self) -> list[dict[str, Any]]:
        return [json.loads(r.body or b"{}") for r in self.sent]


def transport(*answers: Response | Exception) -> Transport:
    return Transport(list(answers), [])


def config(attempts: int = 3) -> AwsConfig:
    return AwsConfig(endpoint_url=ENDPOINT, max_attempts=attempts)


PUT = {
    "TableName": "t",
    "Item": {"pk": {"S": "FACTORY#a"}, "sk": {"S": "LATEST"}, "n": {"N": "24.5"}},
    "ConditionExpression": "attribute_not_exists(pk)",
}


async def test_a_put_is_sent_as_the_api_takes_it_signed_with_the_given_key() -> None:
    t = transport(ok({}))
    async with open_items(config(), None, STATIC, http=t) as items:  # type: ignore[arg-type]
        assert await items.put_item(**PUT) == {}
    assert t.actions() == ["PutItem"]
    assert t.payloads() == [PUT]
    headers = t.sent[0].headers or {}
    assert str(t.sent[0].url).startswith(ENDPOINT)
    assert headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDTEST/")
    assert "/ap-south-1/dynamodb/aws4_request" in headers["Authorization"]


async def test_throttling_is_retried_until_an_attempt_succeeds() -> None:
    t = transport(error(400, "ThrottlingException"), error(500, "InternalServerError"), ok({}))
    async with open_items(config(attempts=3), None, STATIC, http=t) as items:  # type: ignore[arg-type]
        await items.put_item(**PUT)
    assert t.actions() == ["PutItem"] * 3


@pytest.mark.parametrize(
    "failure",
    [
        error(400, "ThrottlingException"),
        error(400, "ProvisionedThroughputExceededException"),
        error(503, "ServiceUnavailable"),
        RequestFailed(aiohttp.ClientConnectionError("reset by peer")),
        TimeoutError(),
    ],
    ids=["throttled", "throughput", "unavailable", "connection-lost", "timed-out"],
)
async def test_a_failure_on_every_attempt_stops_at_max_attempts_as_transient(
    failure: Response | Exception,
) -> None:
    t = transport(*[failure] * 3)
    async with open_items(config(attempts=3), None, STATIC, http=t) as items:  # type: ignore[arg-type]
        with pytest.raises(Transient, match="put LATEST"), translated("put LATEST"):
            await items.put_item(**PUT)
    assert len(t.sent) == 3


@pytest.mark.parametrize(
    ("code", "fields", "raised"),
    [
        ("ConditionalCheckFailedException", {}, Conflict),
        ("TransactionCanceledException", {"CancellationReasons": [{"Code": "None"}]}, Conflict),
        ("TransactionCanceledException", {}, Conflict),  # a body aiodynamo cannot read
        ("ResourceNotFoundException", {}, NotFound),
        ("ValidationException", {}, StorageError),
        ("AccessDeniedException", {}, StorageError),
        ("AnErrorNoClientKnows", {}, StorageError),
    ],
)
async def test_a_refusal_is_not_retried_and_is_translated_by_its_code(
    code: str, fields: dict[str, Any], raised: type[StorageError]
) -> None:
    t = transport(error(400, code, **fields))
    async with open_items(config(), None, STATIC, http=t) as items:  # type: ignore[arg-type]
        with pytest.raises(raised, match=code) as caught, translated("put LATEST"):
            await items.put_item(**PUT)
    assert type(caught.value) is raised
    assert len(t.sent) == 1


async def test_pages_follow_the_last_evaluated_key_until_there_is_none() -> None:
    last = {"pk": {"S": "FACTORY#a"}, "sk": {"S": "HISTORY#2"}}
    t = transport(
        ok({"Items": [{"n": {"N": "1"}}], "LastEvaluatedKey": last}),
        ok({"Items": [{"n": {"N": "2"}}]}),
    )
    query = {"TableName": "t", "KeyConditionExpression": "pk = :p"}
    async with open_items(config(), None, STATIC, http=t) as items:  # type: ignore[arg-type]
        pages = [p async for p in items.get_paginator("query").paginate(**query)]
    assert [p["Items"] for p in pages] == [[{"n": {"N": "1"}}], [{"n": {"N": "2"}}]]
    assert t.actions() == ["Query", "Query"]
    assert t.payloads() == [query, {**query, "ExclusiveStartKey": last}]


async def test_a_page_size_is_sent_as_each_pages_limit_and_the_config_itself_never() -> None:
    last = {"pk": {"S": "FACTORY#a"}, "sk": {"S": "HISTORY#2"}}
    t = transport(ok({"Items": [], "LastEvaluatedKey": last}), ok({"Items": []}))
    query = {"TableName": "t", "KeyConditionExpression": "pk = :p"}
    async with open_items(config(), None, STATIC, http=t) as items:  # type: ignore[arg-type]
        pages = items.get_paginator("query").paginate(**query, PaginationConfig={"PageSize": 10})
        assert len([p async for p in pages]) == 2
    limited = {**query, "Limit": 10}
    assert t.payloads() == [limited, {**limited, "ExclusiveStartKey": last}]


async def test_a_pagination_setting_it_cannot_honour_is_refused_before_sending() -> None:
    t = transport()
    async with open_items(config(), None, STATIC, http=t) as items:  # type: ignore[arg-type]
        pages = items.get_paginator("scan").paginate(
            TableName="t", PaginationConfig={"MaxItems": 5}
        )
        with pytest.raises(ValueError, match="MaxItems"):
            [p async for p in pages]
    assert t.sent == []


async def test_no_pages_for_an_operation_other_than_query_or_scan() -> None:
    async with open_items(config(), None, STATIC, http=transport()) as items:  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="batch_get_item"):
            items.get_paginator("batch_get_item")


@dataclass
class Frozen:
    access_key: str
    secret_key: str
    token: str | None


class ChainCredentials:
    """botocore's credentials as the session hands them out: frozen per call, rotating."""

    def __init__(self, keys: Callable[[], Frozen]) -> None:
        self.keys = keys

    async def get_frozen_credentials(self) -> Frozen:
        return self.keys()


class Session:
    def __init__(self, credentials: ChainCredentials | None) -> None:
        self.credentials, self.asked = credentials, 0

    async def get_credentials(self) -> ChainCredentials | None:
        self.asked += 1
        return self.credentials


async def test_without_a_fixed_key_each_request_is_signed_with_the_chains_current_key() -> None:
    rotation = iter([Frozen("ASIAFIRST", "s1", "token-1"), Frozen("ASIASECOND", "s2", "token-2")])
    session = Session(ChainCredentials(lambda: next(rotation)))
    t = transport(ok({}), ok({}))
    async with open_items(config(), session, None, http=t) as items:  # type: ignore[arg-type]
        await items.put_item(**PUT)
        await items.put_item(**PUT)
    signed = [(r.headers or {}) for r in t.sent]
    assert ["Credential=ASIAFIRST/" in h["Authorization"] for h in signed] == [True, False]
    assert "Credential=ASIASECOND/" in signed[1]["Authorization"]
    assert [h["X-Amz-Security-Token"] for h in signed] == ["token-1", "token-2"]
    assert session.asked == 1  # the chain is resolved once; its credentials refresh themselves


async def test_an_expired_token_asks_the_chain_again_and_retries() -> None:
    keys = iter([Frozen("ASIAOLD", "s", "old"), Frozen("ASIANEW", "s", "new")])
    session = Session(ChainCredentials(lambda: next(keys)))
    t = transport(error(400, "ExpiredTokenException"), ok({}))
    async with open_items(config(), session, None, http=t) as items:  # type: ignore[arg-type]
        await items.put_item(**PUT)
    assert [(r.headers or {})["X-Amz-Security-Token"] for r in t.sent] == ["old", "new"]
    assert session.asked == 2


async def test_no_credentials_in_the_chain_sends_nothing_and_says_so() -> None:
    t = transport()
    async with open_items(config(attempts=2), Session(None), None, http=t) as items:  # type: ignore[arg-type]
        with pytest.raises(StorageError, match="NoCredentialsFound"), translated("put LATEST"):
            await items.put_item(**PUT)
    assert t.sent == []


# a request signed by the item client's signer carries botocore's signature for the same request

REAL = URL("https://dynamodb.ap-south-1.amazonaws.com/")
NOON = datetime(2026, 3, 1, 12, 0, 5, tzinfo=UTC).timestamp()


def botocore_signature(request: Request, secret: str) -> str:
    """SigV4 as botocore computes it over the request's headers, body and date."""
    headers = {k: v for k, v in (request.headers or {}).items() if k != "Authorization"}
    aws = AWSRequest(method="POST", url=str(REAL), data=request.body, headers=headers)
    aws.context["timestamp"] = headers["X-Amz-Date"]
    auth = SigV4Auth(BotoCredentials("AKIDTEST", secret), "dynamodb", "ap-south-1")
    return str(auth.signature(auth.string_to_sign(aws, auth.canonical_request(aws)), aws))


def signature_of(request: Request) -> str:
    return str((request.headers or {})["Authorization"]).rsplit("Signature=", 1)[1]


def test_a_signed_request_carries_botocores_signature_for_it() -> None:
    signer = Signer("ap-south-1", REAL, clock=lambda: NOON)
    body = json.dumps(PUT).encode()
    request = signer.request(Key("AKIDTEST", "secret"), "PutItem", body)
    assert (request.headers or {})["X-Amz-Date"] == "20260301T120005Z"
    assert signature_of(request) == botocore_signature(request, "secret")


def test_the_signing_key_follows_the_day_and_the_key() -> None:
    now = [NOON]
    signer = Signer("ap-south-1", REAL, clock=lambda: now[0])
    body = json.dumps(PUT).encode()
    for secret, at in [("secret", NOON), ("secret", NOON + 86_400), ("other", NOON + 86_400)]:
        now[0] = at
        request = signer.request(Key("AKIDTEST", secret), "PutItem", body)
        assert signature_of(request) == botocore_signature(request, secret)
