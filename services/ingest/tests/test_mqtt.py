"""The manual-acknowledgement hack on aiomqtt's private paho client, and the CONNECT properties."""

from __future__ import annotations

import aiomqtt
import paho.mqtt.client as paho
import pytest

from aegis_ingest.mqtt import Acker, connect_properties, create_client, enable_manual_ack
from aegis_ingest.settings import IngestSettings


async def test_create_client_turns_paho_manual_ack_on_before_connecting() -> None:
    client = create_client(IngestSettings(mqtt_client_id="ingest-unit"))
    inner = client._client
    assert isinstance(inner, paho.Client)
    # paho then skips its automatic PUBACK in _handle_publish (QoS 1) and waits for ack(mid, qos)
    assert inner._manual_ack is True
    assert client.identifier == "ingest-unit"


async def test_acker_sends_nothing_for_qos0_or_after_close() -> None:
    acker = Acker(aiomqtt.Client("127.0.0.1", identifier="ingest-unit"))
    assert acker.ack(1, 0) is False
    acker.close()
    assert acker.ack(1, 1) is False


async def test_unexpected_aiomqtt_internals_fail_loudly() -> None:
    client = aiomqtt.Client("127.0.0.1")
    client._client = object()  # type: ignore[assignment]
    with pytest.raises(TypeError, match="cannot defer"):
        enable_manual_ack(client)


def test_connect_properties_keep_the_session_and_bound_inflight() -> None:
    props = connect_properties(session_expiry_seconds=3600, receive_maximum=32)
    assert props.SessionExpiryInterval == 3600  # type: ignore[attr-defined]
    assert props.ReceiveMaximum == 32  # type: ignore[attr-defined]


def test_settings_build_the_subscription_and_endpoint() -> None:
    s = IngestSettings(mqtt_url="mqtt://user:pw@broker:1884", mqtt_share_group="g1")
    assert s.subscription == "$share/g1/aegis/+/+"
    assert IngestSettings(mqtt_share_group="").subscription == "aegis/+/+"  # one replica
    assert s.mqtt_endpoint() == ("broker", 1884, "user", "pw")
    assert s.mqtt_client_id.startswith("aegis-ingest-")
    assert s.aws().max_attempts == s.aws_max_attempts == 3  # ingest retries each message too


def test_broker_identity_and_tls_settings(tmp_path, monkeypatch) -> None:
    # AEGIS_MQTT_USERNAME/PASSWORD win over the URL's user:pass; the password stays a secret
    monkeypatch.setenv("AEGIS_MQTT_URL", "mqtts://old:old@broker")
    monkeypatch.setenv("AEGIS_MQTT_USERNAME", "aegis-ingest")
    monkeypatch.setenv("AEGIS_MQTT_PASSWORD", "n3w-s3cret")
    s = IngestSettings()
    assert s.mqtt_endpoint() == ("broker", 8883, "aegis-ingest", "n3w-s3cret")
    assert "n3w-s3cret" not in repr(s) and "n3w-s3cret" not in str(s.model_dump(mode="json"))
    context = s.mqtt_tls_context()
    assert context is not None and context.check_hostname
    # plain MQTT: no TLS; a CA file alone turns TLS on (a self-run CA on the default port)
    assert IngestSettings(mqtt_url="mqtt://broker").mqtt_tls_context() is None
    with pytest.raises(FileNotFoundError):
        IngestSettings(
            mqtt_url="mqtt://b:8883", mqtt_ca_file=tmp_path / "none.pem"
        ).mqtt_tls_context()
    with pytest.raises(ValueError, match="AEGIS_MQTT_URL"):
        IngestSettings(mqtt_url="http://broker")
