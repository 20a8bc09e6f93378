"""The simulated fleet, pure: sensor drift and noise, AI detections, infra state, image snapshots,
scenarios and the publishing schedule.

Nothing here does I/O or reads a clock: randomness comes from a seeded :class:`random.Random` and
time is passed in, so a seed and a sequence of instants give the same values every time. The shell
(:mod:`aegis_simulator.runner`) uploads the image bytes and publishes what :meth:`Fleet.due` returns.
"""

from __future__ import annotations

import json
import math
import random
import re
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from aegis_contracts.ids import (
    SourceType,
    topic_for,
    validate_factory_id,
)
from aegis_contracts.keys import image_snapshot_key
from aegis_contracts.times import ensure_utc, format_ts

SCHEMA_VERSION = "1.0"
MODEL_VERSION = "aegis-safety-yolo-2.3.1"
CAMERAS_PER_FACTORY = 4
PIPELINE_STAGES = ("capture", "inference", "uplink", "snapshot")
DEFAULT_FACTORIES = ("factory-a", "factory-b", "factory-c")
DEFAULT_INFLIGHT = 64  # publishes awaiting their PUBACK at once (--inflight)

# what an edge gateway publishes by default, in seconds between messages (per source type)
DEFAULT_INTERVALS: Mapping[SourceType, float] = {
    SourceType.FACTORY_STATE: 5.0,
    SourceType.INFRA_STATE: 15.0,
    SourceType.IMAGE_SNAPSHOT: 60.0,
}
DEFAULT_JITTER = 0.1  # each interval varies by up to ±10 %
START_SPREAD_S = 1.0  # first messages of every source within the first second
CLOCK_SKEW = timedelta(minutes=10)  # ingest flags anything over 5 minutes ahead

_SOURCE_CODE = {
    SourceType.FACTORY_STATE: "fs",
    SourceType.INFRA_STATE: "is",
    SourceType.IMAGE_SNAPSHOT: "im",
}


class ScenarioKind(StrEnum):
    FIRE = "fire"
    GAS_LEAK = "gas_leak"
    EDGE_OFFLINE = "edge_offline"
    CAMERA_OFFLINE = "camera_offline"
    CLOCK_SKEW = "clock_skew"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order"


# how long each scenario lasts when the spec does not say
DEFAULT_DURATIONS: Mapping[ScenarioKind, float] = {
    ScenarioKind.FIRE: 180.0,
    ScenarioKind.GAS_LEAK: 240.0,
    ScenarioKind.EDGE_OFFLINE: 120.0,
    ScenarioKind.CAMERA_OFFLINE: 180.0,
    ScenarioKind.CLOCK_SKEW: 60.0,
    ScenarioKind.DUPLICATE: 60.0,
    ScenarioKind.OUT_OF_ORDER: 60.0,
}

_SPEC = re.compile(
    r"(?P<kind>[a-z_]+)"
    r"(?:@(?P<factory>[a-z0-9][a-z0-9-]{0,62}))?"
    r"(?:\+(?P<delay>\d+(?:\.\d+)?))?"
    r"(?::(?P<duration>\d+(?:\.\d+)?))?"
    r"(?:/(?P<every>\d+(?:\.\d+)?))?"
)
SCENARIO_SYNTAX = "NAME[@FACTORY][+DELAY_S][:DURATION_S][/EVERY_S]"


class ScenarioError(ValueError):
    """A scenario spec that cannot be parsed, or names an unknown scenario or factory."""


@dataclass(frozen=True, slots=True)
class ScenarioSpec:
    """One scenario: what, where (None = every factory), when (seconds after the start), how long,
    and optionally how often it comes back."""

    kind: ScenarioKind
    factory_id: str | None = None
    delay_s: float = 0.0
    duration_s: float = 60.0
    every_s: float | None = None

    def active_at(self, elapsed_s: float) -> float | None:
        """Seconds since this scenario (or its latest repetition) began, or None when inactive."""
        since = elapsed_s - self.delay_s
        if since < 0:
            return None
        if self.every_s is not None:
            since %= self.every_s
        return since if since < self.duration_s else None

    def applies_to(self, factory_id: str) -> bool:
        return self.factory_id is None or self.factory_id == factory_id


def parse_scenario(text: str) -> ScenarioSpec:
    """``NAME[@FACTORY][+DELAY_S][:DURATION_S][/EVERY_S]``, e.g. ``fire@factory-b+30``."""
    match = _SPEC.fullmatch(text.strip())
    if match is None:
        raise ScenarioError(f"scenario {text!r} does not match {SCENARIO_SYNTAX}")
    try:
        kind = ScenarioKind(match["kind"])
    except ValueError:
        known = ", ".join(k.value for k in ScenarioKind)
        raise ScenarioError(f"unknown scenario {match['kind']!r}; known: {known}") from None
    duration = float(match["duration"]) if match["duration"] else DEFAULT_DURATIONS[kind]
    every = float(match["every"]) if match["every"] else None
    if duration <= 0:
        raise ScenarioError(f"scenario {text!r}: the duration must be positive")
    if every is not None and every < duration:
        raise ScenarioError(f"scenario {text!r}: it cannot repeat more often than it lasts")
    return ScenarioSpec(
        kind=kind,
        factory_id=match["factory"],
        delay_s=float(match["delay"]) if match["delay"] else 0.0,
        duration_s=duration,
        every_s=every,
    )


def parse_scenarios(texts: Iterable[str]) -> list[ScenarioSpec]:
    """Several specs; items may also be comma-separated. ``off``/``none``/empty means no scenario."""
    specs = []
    for text in texts:
        for raw in text.split(","):
            part = raw.strip()
            if part and part.lower() not in {"off", "none"}:
                specs.append(parse_scenario(part))
    return specs


def factory_ids(names: str | None = None, count: int | None = None) -> list[str]:
    """``--factories a,b`` or ``--count N`` (factory-001 …); the default fleet otherwise."""
    if names and count:
        raise ValueError("give either a list of factories or a count, not both")
    if count is not None:
        if count < 1:
            raise ValueError("the factory count must be at least 1")
        return [f"factory-{i:03d}" for i in range(1, count + 1)]
    if not names:
        return list(DEFAULT_FACTORIES)
    ids = [validate_factory_id(n.strip()) for n in names.split(",") if n.strip()]
    if len(set(ids)) != len(ids):
        raise ValueError("a factory is listed twice")
    if not ids:
        raise ValueError("no factory given")
    return ids


# ---------------------------------------------------------------------------------------------
# a tiny valid PNG, made with the standard library


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def make_png(width: int, height: int, pixel: Any) -> bytes:
    """An 8-bit RGB PNG; ``pixel(x, y)`` returns an ``(r, g, b)`` tuple."""
    rows = bytearray()
    for y in range(height):
        rows.append(0)  # filter type: none
        for x in range(width):
            rows.extend(pixel(x, y))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        PNG_SIGNATURE
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", zlib.compress(bytes(rows), 6))
        + _png_chunk(b"IEND", b"")
    )


def snapshot_png(rng: random.Random, *, alarm: bool, width: int = 32, height: int = 24) -> bytes:
    """A small noisy gradient; reddish when something burns."""
    base = rng.randrange(40, 120)
    noise = [rng.randrange(0, 24) for _ in range(width)]

    def pixel(x: int, y: int) -> tuple[int, int, int]:
        v = min(255, base + x * 3 + y * 2 + noise[(x + y) % width])
        return (min(255, v + 90), v // 2, v // 3) if alarm else (v, v, min(255, v + 20))

    return make_png(width, height, pixel)


# ---------------------------------------------------------------------------------------------
# what gets emitted


@dataclass(frozen=True, slots=True)
class ImageUpload:
    """The binary the edge snapshot uploader puts under image_snapshot/ before the metadata."""

    key: str
    body: bytes
    content_type: str


@dataclass(frozen=True, slots=True)
class Emission:
    """One MQTT publish: the payload bytes exactly as they go on the wire."""

    factory_id: str
    source_type: SourceType
    topic: str
    message_id: str
    payload: bytes
    image: ImageUpload | None = None
    # why this publish is special (``duplicate``, ``reordered``, ``clock_skew``), for the summary
    tags: frozenset[str] = frozenset()

    def body(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.payload)
        return value


def _encode(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


@dataclass(slots=True)
class _Walk:
    """A mean-reverting random walk: drifts, but always comes back towards its centre."""

    centre: float
    value: float
    step: float
    pull: float = 0.05

    def advance(self, rng: random.Random) -> float:
        self.value += rng.gauss(0.0, self.step) + (self.centre - self.value) * self.pull
        return self.value


@dataclass(slots=True)
class FactoryModel:
    """One factory's edge gateway: its sensors, cameras and host, evolving with every message."""

    factory_id: str
    rng: random.Random
    run_id: str
    cameras: tuple[str, ...] = ()
    seq: int = 0
    started_at: datetime | None = None
    _temp: _Walk = field(init=False)
    _humidity: _Walk = field(init=False)
    _co: _Walk = field(init=False)
    _smoke: _Walk = field(init=False)
    _vibration: _Walk = field(init=False)
    _noise: _Walk = field(init=False)
    _cpu: _Walk = field(init=False)
    _mem: _Walk = field(init=False)
    _rtt: _Walk = field(init=False)
    _disk: float = field(init=False)
    _uptime0: float = field(init=False)
    _temp_base: float = field(init=False)

    def __post_init__(self) -> None:
        validate_factory_id(self.factory_id)
        r = self.rng
        if not self.cameras:
            self.cameras = tuple(f"cam-{i:02d}" for i in range(1, CAMERAS_PER_FACTORY + 1))
        # each factory has its own character: a warmer hall, a noisier line
        self._temp = _Walk(centre=0.0, value=r.uniform(-0.5, 0.5), step=0.08)
        self._humidity = _Walk(centre=r.uniform(42, 55), value=r.uniform(42, 55), step=0.3)
        self._co = _Walk(centre=r.uniform(2.5, 4.0), value=r.uniform(2.5, 4.0), step=0.15)
        self._smoke = _Walk(centre=0.05, value=0.05, step=0.02, pull=0.2)
        self._vibration = _Walk(centre=r.uniform(1.5, 3.5), value=2.5, step=0.2, pull=0.1)
        self._noise = _Walk(centre=r.uniform(74, 80), value=r.uniform(72, 82), step=0.6)
        self._cpu = _Walk(centre=r.uniform(20, 40), value=r.uniform(20, 40), step=3.0, pull=0.2)
        self._mem = _Walk(centre=r.uniform(40, 60), value=r.uniform(40, 60), step=0.5)
        self._rtt = _Walk(centre=r.uniform(15, 35), value=r.uniform(15, 35), step=2.0, pull=0.2)
        self._disk = r.uniform(30, 55)
        self._uptime0 = float(r.randrange(3_600, 30 * 86_400))
        self._temp_base = r.uniform(23.5, 25.5)

    @property
    def device_id(self) -> str:
        return f"{self.factory_id}-edge-01"

    # -- envelope ---------------------------------------------------------------------------

    def _next_id(self, source: SourceType) -> str:
        self.seq += 1
        # factory prefix cut so the id stays within 64 characters: 32 + 1 + 8 + 1 + 2 + 8 = 52
        return f"{self.factory_id[:32]}-{self.run_id}-{_SOURCE_CODE[source]}{self.seq:08d}"

    def _envelope(self, source: SourceType, emitted_at: datetime) -> dict[str, Any]:
        return {
            "message_id": self._next_id(source),
            "factory_id": self.factory_id,
            "device_id": self.device_id,
            "emitted_at": format_ts(emitted_at),
            "schema_version": SCHEMA_VERSION,
        }

    # -- bodies -----------------------------------------------------------------------------

    def sensors(self, now: datetime, effects: Effects) -> dict[str, float]:
        r = self.rng
        hour = now.hour + now.minute / 60
        # warmest mid-afternoon, coolest before dawn: ±1.8 °C around the hall's base
        daily = 1.8 * math.sin(2 * math.pi * (hour - 9.0) / 24.0)
        temp = self._temp_base + daily + _clamp(self._temp.advance(r), -1.5, 1.5)
        co = _clamp(self._co.advance(r), 1.5, 6.0)
        smoke = _clamp(self._smoke.advance(r), 0.0, 0.4)
        values = {
            "temperature_c": temp + r.gauss(0, 0.1),
            "humidity_pct": _clamp(self._humidity.advance(r) + r.gauss(0, 0.2), 20, 80),
            "co_ppm": co + abs(r.gauss(0, 0.1)),
            "smoke_obscuration_pct": smoke,
            "vibration_mm_s": _clamp(self._vibration.advance(r) + r.gauss(0, 0.1), 0.2, 8),
            "noise_db": _clamp(self._noise.advance(r) + r.gauss(0, 0.5), 68, 87),
        }
        values["temperature_c"] += effects.temperature_rise_c
        values["co_ppm"] = max(values["co_ppm"], effects.co_ppm_floor) + (
            r.uniform(0, 2.0) if effects.co_ppm_floor else 0.0
        )
        values["smoke_obscuration_pct"] = _clamp(
            values["smoke_obscuration_pct"] + effects.smoke_pct, 0.0, 100.0
        )
        return {k: round(v, 2) for k, v in values.items()}

    def detections(self, effects: Effects) -> list[dict[str, Any]]:
        r = self.rng
        cameras = [c for c in self.cameras if c not in effects.offline_cameras]
        if not cameras:
            return []
        found: list[dict[str, Any]] = []
        if effects.fire:
            camera = cameras[0]
            found.append(self._detection("fire", r.uniform(0.86, 0.98), camera))
            found.append(self._detection("smoke", r.uniform(0.82, 0.97), camera))
        roll = r.random()
        if roll < 0.08:
            found.append(self._detection("no_helmet", r.uniform(0.6, 0.8), r.choice(cameras)))
        elif roll < 0.10:
            found.append(self._detection("person", r.uniform(0.7, 0.95), r.choice(cameras)))
        return found

    def _detection(self, label: str, confidence: float, camera: str) -> dict[str, Any]:
        r = self.rng
        x, y = r.uniform(0, 0.7), r.uniform(0, 0.7)
        w, h = r.uniform(0.05, 0.3), r.uniform(0.05, 0.3)
        return {
            "label": label,
            "confidence": round(confidence, 3),
            "camera_id": camera,
            "bbox": [round(x, 3), round(y, 3), round(w, 3), round(h, 3)],
        }

    def factory_state(self, now: datetime, effects: Effects) -> dict[str, Any]:
        return {
            **self._envelope(SourceType.FACTORY_STATE, now + effects.clock_offset),
            "sensors": self.sensors(now, effects),
            "ai": {"model_version": MODEL_VERSION, "detections": self.detections(effects)},
        }

    def infra_state(self, now: datetime, effects: Effects) -> dict[str, Any]:
        r = self.rng
        if self.started_at is None:
            self.started_at = now
        self._disk = _clamp(self._disk + r.uniform(0, 0.01), 0, 99)
        uptime = self._uptime0 + max(0.0, (now - self.started_at).total_seconds())
        cameras = {c: "offline" if c in effects.offline_cameras else "online" for c in self.cameras}
        pipeline = dict.fromkeys(PIPELINE_STAGES, "ok")
        if effects.offline_cameras:
            pipeline["capture"] = "degraded"
        return {
            **self._envelope(SourceType.INFRA_STATE, now + effects.clock_offset),
            "host": {
                "cpu_pct": round(_clamp(self._cpu.advance(r), 3, 97), 1),
                "mem_pct": round(_clamp(self._mem.advance(r), 10, 95), 1),
                "disk_pct": round(self._disk, 2),
                "temperature_c": round(48 + r.gauss(0, 1.5) + self._cpu.value / 10, 1),
                "uptime_s": round(uptime, 1),
            },
            "network": {
                "rtt_ms": round(_clamp(self._rtt.advance(r), 2, 500), 1),
                "loss_pct": round(_clamp(abs(r.gauss(0, 0.15)), 0, 100), 2),
            },
            "cameras": cameras,
            "pipeline": pipeline,
        }

    def image_snapshot(self, now: datetime, effects: Effects) -> tuple[dict[str, Any], bytes]:
        """The metadata message and the PNG it describes; None of the cameras online: no image."""
        envelope = self._envelope(SourceType.IMAGE_SNAPSHOT, now + effects.clock_offset)
        cameras = [c for c in self.cameras if c not in effects.offline_cameras]
        camera = self.rng.choice(cameras)
        captured_at = now + effects.clock_offset
        stamp = format_ts(captured_at).replace("-", "").replace(":", "").replace(".", "")
        filename = f"{camera}-{stamp}-{self.seq:08d}.png"
        body = snapshot_png(self.rng, alarm=effects.fire)
        return {
            **envelope,
            "camera_id": camera,
            "filename": filename,
            "content_type": "image/png",
            "size_bytes": len(body),
            "captured_at": format_ts(captured_at),
            "s3_key": image_snapshot_key(self.factory_id, captured_at, filename),
        }, body


@dataclass(frozen=True, slots=True)
class Effects:
    """What the active scenarios do to one factory at one instant."""

    temperature_rise_c: float = 0.0
    smoke_pct: float = 0.0
    co_ppm_floor: float = 0.0
    fire: bool = False
    offline_cameras: frozenset[str] = frozenset()
    clock_offset: timedelta = timedelta(0)
    silent: bool = False
    duplicate: bool = False
    reorder: bool = False


# gas leak: CO climbs past the usual WARNING (35 ppm) and CRITICAL (100 ppm) marks
GAS_PEAK_PPM = 150.0
GAS_RAMP_S = 90.0
FIRE_RAMP_S = 60.0


def effects_for(
    factory_id: str, cameras: Sequence[str], scenarios: Sequence[ScenarioSpec], elapsed_s: float
) -> Effects:
    """Combine every scenario active for ``factory_id`` ``elapsed_s`` seconds into the run."""
    effects = Effects()
    for spec in scenarios:
        if not spec.applies_to(factory_id):
            continue
        since = spec.active_at(elapsed_s)
        if since is None:
            continue
        match spec.kind:
            case ScenarioKind.FIRE:
                ramp = min(1.0, since / FIRE_RAMP_S)
                effects = replace(
                    effects,
                    temperature_rise_c=effects.temperature_rise_c + 8.0 + 37.0 * ramp,
                    smoke_pct=effects.smoke_pct + 5.0 + 35.0 * ramp,
                    co_ppm_floor=max(effects.co_ppm_floor, 10.0 + 30.0 * ramp),
                    fire=True,
                )
            case ScenarioKind.GAS_LEAK:
                ramp = min(1.0, since / GAS_RAMP_S)
                effects = replace(
                    effects, co_ppm_floor=max(effects.co_ppm_floor, 8.0 + GAS_PEAK_PPM * ramp)
                )
            case ScenarioKind.EDGE_OFFLINE:
                effects = replace(effects, silent=True)
            case ScenarioKind.CAMERA_OFFLINE:
                effects = replace(effects, offline_cameras=effects.offline_cameras | {cameras[-1]})
            case ScenarioKind.CLOCK_SKEW:
                effects = replace(effects, clock_offset=CLOCK_SKEW)
            case ScenarioKind.DUPLICATE:
                effects = replace(effects, duplicate=True)
            case ScenarioKind.OUT_OF_ORDER:
                effects = replace(effects, reorder=True)
    return effects


# ---------------------------------------------------------------------------------------------
# the fleet and its schedule


def scaled_intervals(
    rate: float | None, n_factories: int, *, images: bool = True
) -> dict[SourceType, float]:
    """Per-factory intervals. With ``rate`` (messages/s for the whole fleet) every interval is
    scaled by the same factor, so the mix of sources stays the edge gateway's."""
    intervals = {
        st: s
        for st, s in DEFAULT_INTERVALS.items()
        if images or st is not SourceType.IMAGE_SNAPSHOT
    }
    if rate is None:
        return intervals
    if rate <= 0:
        raise ValueError("the rate must be positive")
    natural = n_factories * sum(1 / s for s in intervals.values())
    factor = natural / rate
    return {st: s * factor for st, s in intervals.items()}


@dataclass(slots=True)
class _Slot:
    factory: FactoryModel
    source: SourceType
    due: float  # seconds since the start
    held: Emission | None = None  # out_of_order: the message waiting for a newer one


class Fleet:
    """Every factory of a run. ``due(now)`` returns the publishes whose time has come, in order;
    ``next_due()`` says when to call it again; ``take(now)`` serves load mode (next slot, now)."""

    def __init__(
        self,
        factories: Sequence[str],
        *,
        start: datetime,
        seed: int | None = None,
        run_id: str = "r00000",
        scenarios: Sequence[ScenarioSpec] = (),
        intervals: Mapping[SourceType, float] | None = None,
        jitter: float = DEFAULT_JITTER,
    ) -> None:
        if not factories:
            raise ValueError("a fleet needs at least one factory")
        if not re.fullmatch(r"[A-Za-z0-9]{1,8}", run_id):
            raise ValueError("run_id must be 1-8 letters or digits")
        if not 0 <= jitter < 1:
            raise ValueError("jitter must be in [0, 1)")
        for spec in scenarios:
            if spec.factory_id is not None and spec.factory_id not in factories:
                raise ScenarioError(
                    f"scenario {spec.kind.value} names {spec.factory_id!r}, "
                    f"which is not simulated ({', '.join(factories)})"
                )
        self.start = ensure_utc(start)
        self.rng = random.Random(seed)  # noqa: S311 - simulated telemetry, not secrets
        self.scenarios = list(scenarios)
        self.intervals = dict(intervals or DEFAULT_INTERVALS)
        self.jitter = jitter
        self.models = {
            f: FactoryModel(f, random.Random(self.rng.getrandbits(64)), run_id)  # noqa: S311
            for f in factories
        }
        self._slots = [
            _Slot(model, st, self.rng.uniform(0, min(START_SPREAD_S, interval)))
            for model in self.models.values()
            for st, interval in self.intervals.items()
        ]

    def elapsed(self, now: datetime) -> float:
        return (ensure_utc(now) - self.start).total_seconds()

    def next_due(self) -> datetime:
        return self.start + timedelta(seconds=min(s.due for s in self._slots))

    def _advance(self, slot: _Slot) -> None:
        interval = self.intervals[slot.source]
        slot.due += interval * (1 + self.rng.uniform(-self.jitter, self.jitter))

    def due(self, now: datetime) -> list[Emission]:
        """Everything due at or before ``now``, oldest slot first."""
        elapsed = self.elapsed(now)
        out: list[Emission] = []
        while True:
            slot = min(self._slots, key=lambda s: s.due)
            if slot.due > elapsed:
                break
            self._advance(slot)
            out.extend(self._emit(slot, now, elapsed))
        out.extend(self._release_held(elapsed))
        return out

    def take(self, now: datetime) -> list[Emission]:
        """Load mode: the next slot in schedule order, stamped ``now`` whatever its due time."""
        slot = min(self._slots, key=lambda s: s.due)
        self._advance(slot)
        elapsed = self.elapsed(now)
        return [*self._emit(slot, now, elapsed), *self._release_held(elapsed)]

    def _emit(self, slot: _Slot, now: datetime, elapsed: float) -> list[Emission]:
        model = slot.factory
        effects = effects_for(model.factory_id, model.cameras, self.scenarios, elapsed)
        if effects.silent:
            return []
        if slot.source is SourceType.IMAGE_SNAPSHOT and len(effects.offline_cameras) >= len(
            model.cameras
        ):
            return []
        emission = self._build(model, slot.source, now, effects)
        if effects.duplicate:
            dup = replace(emission, image=None, tags=emission.tags | {"duplicate"})
            return [emission, dup]
        if effects.reorder:
            if slot.held is None:
                slot.held = emission
                return []
            held, slot.held = slot.held, None
            return [emission, replace(held, tags=held.tags | {"reordered"})]
        return [emission]

    def _release_held(self, elapsed: float) -> list[Emission]:
        """A held message is sent once out_of_order has ended for its factory (never lost)."""
        out = []
        for slot in self._slots:
            if slot.held is None:
                continue
            model = slot.factory
            effects = effects_for(model.factory_id, model.cameras, self.scenarios, elapsed)
            if not effects.reorder:
                out.append(replace(slot.held, tags=slot.held.tags | {"reordered"}))
                slot.held = None
        return out

    def flush(self) -> list[Emission]:
        """Messages still held back at the end of a run."""
        out = [replace(s.held, tags=s.held.tags | {"reordered"}) for s in self._slots if s.held]
        for slot in self._slots:
            slot.held = None
        return out

    @staticmethod
    def _build(
        model: FactoryModel, source: SourceType, now: datetime, effects: Effects
    ) -> Emission:
        image: ImageUpload | None = None
        if source is SourceType.FACTORY_STATE:
            body = model.factory_state(now, effects)
        elif source is SourceType.INFRA_STATE:
            body = model.infra_state(now, effects)
        else:
            body, png = model.image_snapshot(now, effects)
            image = ImageUpload(key=body["s3_key"], body=png, content_type=body["content_type"])
        tags = frozenset({"clock_skew"}) if effects.clock_offset else frozenset()
        return Emission(
            factory_id=model.factory_id,
            source_type=source,
            topic=topic_for(model.factory_id, source),
            message_id=body["message_id"],
            payload=_encode(body),
            image=image,
            tags=tags,
        )
