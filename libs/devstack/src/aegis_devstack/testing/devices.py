"""Device messages for tests and benches: a factory_state payload as an edge device sends it."""

from __future__ import annotations

import json
from datetime import datetime


def factory_state_message(
    factory: str, message_id: str, at: datetime, *, fire: bool = False
) -> bytes:
    """A factory_state payload emitted at ``at``: calm sensors, and a fire on cam-1 if ``fire``."""
    return json.dumps(
        {
            "message_id": message_id,
            "factory_id": factory,
            "device_id": "edge-1",
            "emitted_at": at.isoformat(),
            "schema_version": "1.0",
            "sensors": {"temperature_c": 24.0, "co_ppm": 3.0},
            "ai": {
                "model_version": "yolo-1",
                "detections": (
                    [{"label": "fire", "confidence": 0.93, "camera_id": "cam-1"}] if fire else []
                ),
            },
        }
    ).encode()
