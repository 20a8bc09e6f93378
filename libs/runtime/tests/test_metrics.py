"""aegis_runtime.metrics: one registry per service, ``aegis_`` names, Prometheus text output."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from aegis_runtime.metrics import Metrics


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_standard_metrics_are_exposed_with_the_aegis_prefix() -> None:
    metrics = Metrics("processor")
    metrics.messages_total.labels(consumer="processor", outcome="ok").inc(2)
    metrics.messages_total.labels(consumer="orchestrator-raw", outcome="ok").inc()
    metrics.dead_letters_total.labels(reason="invalid_payload").inc()
    metrics.inflight.labels(consumer="processor").inc()
    metrics.handler_seconds.labels(consumer="processor").observe(0.003)

    samples = _samples(metrics)
    ok = (("consumer", "processor"), ("outcome", "ok"))
    assert samples[("aegis_messages_total", ok)] == 2
    assert samples[("aegis_dead_letters_total", (("reason", "invalid_payload"),))] == 1
    assert samples[("aegis_inflight", (("consumer", "processor"),))] == 1
    assert samples[("aegis_handler_seconds_count", (("consumer", "processor"),))] == 1
    low, high = (
        (("consumer", "processor"), ("le", "0.0025")),
        (("consumer", "processor"), ("le", "0.005")),
    )
    assert samples[("aegis_handler_seconds_bucket", low)] == 0
    assert samples[("aegis_handler_seconds_bucket", high)] == 1
    # a reader of every consumer's outcome sums over consumers
    assert metrics.total("messages_total", outcome="ok") == 3
    assert metrics.total("messages_total", consumer="processor") == 2
    assert metrics.total("messages_total", outcome="retried") == 0
    assert samples[("aegis_service_info", (("service", "processor"),))] == 1


def test_text_format_has_help_and_type_lines() -> None:
    text = Metrics("ingest").render().decode()
    assert "# TYPE aegis_messages_total counter" in text
    assert "# TYPE aegis_handler_seconds histogram" in text
    assert Metrics.content_type.startswith("text/plain")


def test_each_instance_has_its_own_registry() -> None:
    first, second = Metrics("a"), Metrics("b")  # no "Duplicated timeseries" error
    first.messages_total.labels(consumer="c", outcome="ok").inc()
    key = ("aegis_messages_total", (("consumer", "c"), ("outcome", "ok")))
    assert key not in _samples(second)
    assert _samples(first)[key] == 1


def test_service_metrics_get_the_prefix_once() -> None:
    metrics = Metrics("reporter")
    reports = metrics.counter("reports_written_total", "Reports written.", ["kind"])
    lag = metrics.gauge("aegis_window_lag_seconds", "Age of the oldest unprocessed window.")
    size = metrics.histogram("report_bytes", "Report size.", buckets=(1000.0, 100000.0))
    reports.labels(kind="daily").inc()
    lag.set(42)
    size.observe(50000)

    samples = _samples(metrics)
    assert samples[("aegis_reports_written_total", (("kind", "daily"),))] == 1
    assert samples[("aegis_window_lag_seconds", ())] == 42
    assert samples[("aegis_report_bytes_bucket", (("le", "100000.0"),))] == 1
    assert samples[("aegis_report_bytes_bucket", (("le", "1000.0"),))] == 0


def test_process_gc_and_python_collectors_are_in_every_registry() -> None:
    """What an operator's dashboards expect of any Prometheus target (process_* on Linux)."""
    names = {name for name, _ in _samples(Metrics("aggregator"))}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= names
    assert "python_gc_collections_total" in names
    assert "python_info" in names
    # own metrics keep the prefix; the standard collectors keep their standard names
    assert not {n for n in names if n.startswith("aegis_process")}
