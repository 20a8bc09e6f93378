"""Report generators: report-context.json in, report.md out.

The default is the deterministic template (:mod:`aegis_reporter.markdown`). The Bedrock generator
asks a model (Converse API through aiobotocore) to write the report from the context alone and
falls back to the template when the call fails, recording why in generation-metadata.json.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from aegis_reporter.markdown import render
from aegis_storage.clients import AwsConfig, open_client

log = structlog.get_logger(__name__)

TEMPLATE_VERSION = "2"
SYSTEM_PROMPT = (
    "You write the daily safety report of one factory (or of the cloud infrastructure) for its "
    "operators, in Markdown that reads well in a terminal and a browser. Use only the facts in "
    "the JSON you are given; never invent a figure. Start with a one-line status, then the risk "
    "timeline, incidents (KST times and durations), sensors, AI detections, data completeness "
    "(missing hours are missing, not zero), edge infrastructure and image snapshots; for the "
    "cloud infrastructure: availability per check, incidents, worst latencies and drift. Then "
    "the alert incidents: each one, who acknowledged it and how fast, MTTA and MTTR (say which "
    "incidents were never acknowledged or are still open)."
)


@dataclass(frozen=True, slots=True)
class Generated:
    markdown: str
    # what generation-metadata.json records about it: name, version, model, token counts, …
    info: dict[str, Any] = field(default_factory=dict)


class ReportGenerator(Protocol):
    name: str

    async def generate(self, context: Mapping[str, Any]) -> Generated: ...


class TemplateGenerator:
    name = "template"

    async def generate(self, context: Mapping[str, Any]) -> Generated:
        return Generated(render(context), {"name": self.name, "version": TEMPLATE_VERSION})


class BedrockGenerator:
    """Amazon Bedrock (``bedrock-runtime`` Converse); any failure falls back to ``fallback``."""

    name = "bedrock"

    def __init__(
        self,
        *,
        model_id: str,
        aws: AwsConfig,
        fallback: ReportGenerator | None = None,
        max_tokens: int = 4096,
    ) -> None:
        self.model_id = model_id
        self.aws = aws
        self.fallback = fallback or TemplateGenerator()
        self.max_tokens = max_tokens

    async def _converse(self, context: Mapping[str, Any]) -> Generated:
        async with open_client("bedrock-runtime", self.aws) as client:
            resp = await client.converse(
                modelId=self.model_id,
                system=[{"text": SYSTEM_PROMPT}],
                messages=[
                    {
                        "role": "user",
                        "content": [{"text": json.dumps(context, sort_keys=True)}],
                    }
                ],
                inferenceConfig={"maxTokens": self.max_tokens, "temperature": 0.0},
            )
        parts = resp["output"]["message"]["content"]
        text = "".join(str(p.get("text", "")) for p in parts).strip()
        if not text:
            raise ValueError("the model returned no text")
        usage = resp.get("usage", {})
        return Generated(
            text + "\n",
            {
                "name": self.name,
                "model": self.model_id,
                "input_tokens": usage.get("inputTokens"),
                "output_tokens": usage.get("outputTokens"),
                "stop_reason": resp.get("stopReason"),
            },
        )

    async def generate(self, context: Mapping[str, Any]) -> Generated:
        try:
            return await self._converse(context)
        except Exception as err:  # any failure of the model path: the template still reports
            log.warning("generator_fell_back", generator=self.name, error=repr(err)[:300])
            fallback = await self.fallback.generate(context)
            return Generated(
                fallback.markdown,
                {
                    **fallback.info,
                    "fallback_from": self.name,
                    "model": self.model_id,
                    "error": type(err).__name__,
                },
            )
