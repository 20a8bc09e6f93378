"""deploy/k8s rendered by kustomize and checked without a cluster.

`kubectl kustomize` (the pinned kubectl that `make test` installs into the venv, see
tests/tools/install_kubectl.py) renders the base and both overlays; every object is validated
against the Kubernetes schemas (kubernetes-validate, strict), then the platform's invariants are
asserted: probes on the ports the containers open, requests and limits, one ServiceAccount per
workload, HPAs only on ingest and processor, images and commands of the workspace. The aws
overlay's NATS Helm chart needs the network: it is rendered with the chart left out and the
chart reference is checked on its own.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]  # no stubs
import pytest
import yaml

from aegis_alert_dispatcher.settings import DispatcherSettings
from aegis_contracts.bus import ADMIN, IDENTITIES
from aegis_devstack.testing.workspace import Workspace
from aegis_ingest.settings import IngestSettings
from aegis_orchestrator.settings import OrchestratorSettings
from aegis_processor.settings import ProcessorSettings
from aegis_runtime.settings import AegisSettings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
WORKSPACE = Workspace(ROOT)
KUBERNETES_VERSION = "1.33.0"  # the kubectl's minor; EKS and kind both run it
AEGIS_UID = 10001
HPA_TARGETS = {"ingest", "processor"}
KEDA_GROUP = "keda.sh"
# the JetStream consumers each service reads (its settings' durable names), by service
CONSUMERS = {
    "processor": {("AEGIS_RAW", ProcessorSettings().durable)},
    "alert-dispatcher": {("AEGIS_EVENTS", DispatcherSettings().alert_durable)},
    "orchestrator": {
        (stream, f"{OrchestratorSettings().orchestrator_durable}-{name}")
        for stream, name in (
            ("AEGIS_EVENTS", "changes"),
            ("AEGIS_EVENTS", "events"),
            ("AEGIS_RAW", "raw"),
        )
    },
}
NATS_CHART = {"name": "nats", "repo": "https://nats-io.github.io/k8s/helm/charts/"}
# the demo fleet runs only where there are no real factories
LOCAL_ONLY = {"simulator"}
WORKLOAD_KINDS = {"Deployment", "StatefulSet"}
Doc = dict[str, Any]


def kubectl() -> str:
    found = Path(sys.prefix) / "bin" / "kubectl"
    path = str(found) if found.is_file() else shutil.which("kubectl")
    assert path, "no kubectl: `make test` installs it (tests/tools/install_kubectl.py)"
    return path


def kustomize(directory: Path) -> list[Doc]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"kustomize {directory}: {result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def aws_kustomization() -> Doc:
    path = K8S / "overlays" / "aws" / "kustomization.yaml"
    return cast("Doc", yaml.safe_load(path.read_text(encoding="utf-8")))


@functools.cache
def rendered(target: str) -> tuple[Doc, ...]:
    if target != "aws":
        directory = K8S if target == "base" else K8S / "overlays"
        return tuple(kustomize(directory / target))
    # The same tree with the aws overlay's helmCharts left out (rendering the chart needs helm and
    # the chart repository); test_nats_comes_from_its_official_helm_chart checks the reference.
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "k8s"
        shutil.copytree(K8S, scratch)
        kustomization = aws_kustomization()
        assert kustomization.pop("helmCharts", None), "the aws overlay lost its NATS chart"
        (scratch / "overlays" / "aws" / "kustomization.yaml").write_text(
            yaml.safe_dump(kustomization), encoding="utf-8"
        )
        return tuple(kustomize(scratch / "overlays" / "aws"))


def of_kind(docs: tuple[Doc, ...], *kinds: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] in kinds}


def workloads(docs: tuple[Doc, ...]) -> dict[str, Doc]:
    return of_kind(docs, *WORKLOAD_KINDS)


def pod_spec(workload: Doc) -> Doc:
    return cast("Doc", workload["spec"]["template"]["spec"])


def image_name(image: str) -> str:
    """`registry/path/aegis-ingest:0.1.0` -> `aegis-ingest`."""
    return image.rsplit("/", 1)[-1].split("@", maxsplit=1)[0].split(":", maxsplit=1)[0]


def aegis_workloads(docs: tuple[Doc, ...]) -> dict[str, tuple[Doc, Doc]]:
    """Workloads running a deployable of the workspace: name -> (workload, its container)."""
    found = {}
    for name, workload in workloads(docs).items():
        (container, *others) = pod_spec(workload)["containers"]
        if image_name(container["image"]) in WORKSPACE.members:
            assert not others, f"{name}: one container per AEGIS pod"
            found[name] = (workload, container)
    return found


def settings_of(docs: tuple[Doc, ...]) -> dict[str, str]:
    (config,) = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("aegis-settings-")
    ]
    return cast("dict[str, str]", config["data"])


TARGETS = ["base", "local", "aws"]


@pytest.mark.parametrize("target", TARGETS)
def test_every_rendered_object_is_valid_for_kubernetes(target: str) -> None:
    errors = []
    for doc in rendered(target):
        if doc["apiVersion"].startswith(f"{KEDA_GROUP}/"):
            continue  # a custom resource: test_consumers_scale_on_their_jetstream_lag checks it
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {err.message}")
    assert not errors, "\n".join(errors)
    assert not [d for d in rendered(target) if d["metadata"].get("namespace", "aegis") != "aegis"]


def test_the_validation_refuses_what_a_cluster_would() -> None:
    # Strict: a misspelt field and a wrong type are both errors, as for the API server.
    workload, _ = aegis_workloads(rendered("base"))["processor"]
    bad = yaml.safe_load(yaml.safe_dump(workload))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/x"
    with pytest.raises(kubernetes_validate.ValidationError, match="paht"):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)
    bad = yaml.safe_load(yaml.safe_dump(workload))
    bad["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_kustomize_refuses_a_broken_overlay(tmp_path: Path) -> None:
    shutil.copytree(K8S, tmp_path / "k8s")
    overlay = tmp_path / "k8s" / "overlays" / "local"
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text(encoding="utf-8"))
    kustomization["resources"].append("missing.yaml")
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization), encoding="utf-8")
    result = subprocess.run(
        [kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, check=False
    )
    assert result.returncode != 0 and "missing.yaml" in result.stderr


@pytest.mark.parametrize("target", TARGETS)
def test_every_deployable_runs_its_own_image_and_command(target: str) -> None:
    found = aegis_workloads(rendered(target))
    expected = set(WORKSPACE.deployables) - (set() if target == "local" else LOCAL_ONLY)
    assert set(found) == expected
    for name, (_, container) in found.items():
        deployable = WORKSPACE.deployables[name]
        assert image_name(container["image"]) == deployable.package, name
        assert container["command"] == [deployable.script], name


@pytest.mark.parametrize("target", TARGETS)
def test_workloads_have_probes_resources_and_their_own_service_account(target: str) -> None:
    docs = rendered(target)
    accounts = of_kind(docs, "ServiceAccount")
    used = Counter(pod_spec(w).get("serviceAccountName") for w in workloads(docs).values())
    used.update(pod_spec(j)["serviceAccountName"] for j in of_kind(docs, "Job").values())
    shared = [account for account, count in used.items() if count > 1]
    assert not shared, f"ServiceAccounts shared by several workloads: {shared}"
    for name, workload in {**workloads(docs), **of_kind(docs, "Job")}.items():
        spec = pod_spec(workload)
        assert spec.get("serviceAccountName") == name, f"{name}: its own ServiceAccount"
        assert name in accounts, f"{name}: ServiceAccount {name} is not rendered"
        assert spec.get("automountServiceAccountToken") is False, f"{name}: no API token"
        for container in spec["containers"]:
            resources = container.get("resources", {})
            for bound in ("requests", "limits"):
                assert set(resources.get(bound, {})) >= {"cpu", "memory"}, (
                    f"{name}/{container['name']}: {bound} for cpu and memory"
                )
            if workload["kind"] == "Job":
                continue
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                action = container.get(probe, {})
                handler = action.get("httpGet") or action.get("tcpSocket")
                assert handler, f"{name}: no {probe}"
                port = handler["port"]
                assert port in ports or port in ports.values(), (
                    f"{name}: {probe} asks port {port}, the container opens {ports}"
                )


@pytest.mark.parametrize("target", TARGETS)
def test_aegis_pods_probe_their_health_endpoints_and_run_locked_down(target: str) -> None:
    for name, (workload, container) in aegis_workloads(rendered(target)).items():
        deployable = WORKSPACE.deployables[name]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for probe, path in (
            ("startupProbe", "/healthz"),
            ("livenessProbe", "/healthz"),
            ("readinessProbe", "/readyz"),
        ):
            get = container[probe]["httpGet"]
            assert get["path"] == path, f"{name}: {probe} asks {get['path']}"
            assert ports[get["port"]] == deployable.health_port, f"{name}: {probe} port"
        pod = pod_spec(workload)["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == AEGIS_UID, name
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        own = container["securityContext"]
        assert own["readOnlyRootFilesystem"] is True, f"{name}: read-only root filesystem"
        assert own["allowPrivilegeEscalation"] is False, name
        assert own["runAsUser"] == AEGIS_UID and own["capabilities"] == {"drop": ["ALL"]}, name
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/tmp" in mounts, f"{name}: a writable /tmp beside the read-only root"


@pytest.mark.parametrize("target", TARGETS)
def test_cpu_autoscaling_only_for_ingest_and_processor(target: str) -> None:
    docs = rendered(target)
    scalers = of_kind(docs, "HorizontalPodAutoscaler")
    targets = {hpa["spec"]["scaleTargetRef"]["name"] for hpa in scalers.values()}
    # where KEDA scales a workload it owns that workload's autoscaler: no second one
    keda = {so["spec"]["scaleTargetRef"]["name"] for so in of_kind(docs, "ScaledObject").values()}
    assert targets == HPA_TARGETS - keda
    assert not targets & keda
    for hpa in scalers.values():
        assert hpa["apiVersion"] == "autoscaling/v2"
        ref = hpa["spec"]["scaleTargetRef"]
        assert workloads(docs)[ref["name"]]["kind"] == ref["kind"]
        (metric,) = hpa["spec"]["metrics"]
        assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
        assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_consumers_scale_on_their_jetstream_lag() -> None:
    """The aws overlay's KEDA ScaledObjects: each targets a workload of the render, reads lag
    of exactly the consumers that workload reads (from the NATS chart's headless Service, whose
    pods KEDA addresses by name), falls back to fixed replicas when it cannot, and scales down
    slowly; KEDA's operator may reach the monitoring port."""
    docs = rendered("aws")
    objects = of_kind(docs, "ScaledObject")
    assert set(objects) == set(CONSUMERS), "every JetStream consumer service scales on its lag"
    for name, so in objects.items():
        assert so["apiVersion"] == f"{KEDA_GROUP}/v1alpha1"
        spec = so["spec"]
        ref = spec["scaleTargetRef"]
        assert workloads(docs)[ref["name"]]["kind"] == ref.get("kind", "Deployment") == "Deployment"
        assert (
            1 <= spec["minReplicaCount"] <= spec["fallback"]["replicas"] <= spec["maxReplicaCount"]
        )
        assert spec["fallback"]["failureThreshold"] >= 1
        behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300
        lag = [t for t in spec["triggers"] if t["type"] == "nats-jetstream"]
        assert {(t["metadata"]["stream"], t["metadata"]["consumer"]) for t in lag} == CONSUMERS[
            name
        ]
        for trigger in lag:
            meta = trigger["metadata"]
            assert set(meta) <= {
                "natsServerMonitoringEndpoint", "account", "stream", "consumer", "lagThreshold",
                "activationLagThreshold", "useHttps",
            }, f"{name}: unknown nats-jetstream metadata"  # fmt: skip
            assert (
                meta["natsServerMonitoringEndpoint"] == "nats-headless.aegis.svc.cluster.local:8222"
            )
            assert meta["account"] == "$G"  # the identities of `aegis nats-auth` live there
            assert int(meta["lagThreshold"]) > 0 and meta["useHttps"] == "false"
    values = aws_kustomization()["helmCharts"][0]["valuesInline"]["config"]
    assert values["monitor"]["enabled"], "KEDA reads lag from the monitoring endpoint"
    policies = of_kind(docs, "NetworkPolicy")
    (keda_rule,) = policies["nats-monitoring-keda"]["spec"]["ingress"]
    assert keda_rule["ports"] == [{"port": 8222, "protocol": "TCP"}]
    assert keda_rule["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "keda"
    }


def test_ingest_scales_down_one_replica_at_a_time_with_time_to_hand_over() -> None:
    """A replica that goes away first hands its MQTT session over (unsubscribes, archives what
    was queued for it, within its shutdown grace): its pod must get that long, and the
    autoscaler removes one at a time, slowly."""
    for target in TARGETS:
        docs = rendered(target)
        ingest = workloads(docs)["ingest"]
        grace = pod_spec(ingest)["terminationGracePeriodSeconds"]
        assert grace >= IngestSettings().ingest_shutdown_grace_s + 10
        scale_down = of_kind(docs, "HorizontalPodAutoscaler")["ingest"]["spec"]["behavior"][
            "scaleDown"
        ]
        assert scale_down["stabilizationWindowSeconds"] >= 300
        assert scale_down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]


@pytest.mark.parametrize("target", TARGETS)
def test_disruption_budgets_and_services_select_their_pods(target: str) -> None:
    docs = rendered(target)
    pods = {
        name: w["spec"]["template"]["metadata"]["labels"] for name, w in workloads(docs).items()
    }

    def selected(selector: dict[str, str]) -> set[str]:
        return {name for name, labels in pods.items() if selector.items() <= labels.items()}

    budgets = of_kind(docs, "PodDisruptionBudget")
    for name in aegis_workloads(docs):
        assert name in budgets, f"{name}: no PodDisruptionBudget"
        assert selected(budgets[name]["spec"]["selector"]["matchLabels"]) == {name}
    services = of_kind(docs, "Service")
    for name, (workload, container) in aegis_workloads(docs).items():
        port_names = {p["name"] for p in container["ports"]}
        service = services["dashboard-api" if name == "dashboard-api" else f"{name}-metrics"]
        assert selected(service["spec"]["selector"]) == {name}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
        if workload["kind"] == "StatefulSet":
            assert workload["spec"]["serviceName"] in services, f"{name}: its governing Service"
    assert services["dashboard-api"]["spec"]["ports"][0]["port"] == 8080


@pytest.mark.parametrize("target", TARGETS)
def test_settings_come_from_the_config_map_and_secrets_are_only_referenced(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = rendered(target)
    assert not of_kind(docs, "Secret"), "no secret values in the repository"
    settings = settings_of(docs)
    config_name = next(
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("aegis-settings-")
    )
    for name, (_, container) in aegis_workloads(docs).items():
        assert {"configMapRef": {"name": config_name}} in container["envFrom"], name
        for variable in container.get("env", []):
            secret = variable.get("valueFrom", {}).get("secretKeyRef")
            if re.search(r"PASSWORD|TOKENS|WEBHOOK|SECRET", variable["name"]):
                assert secret, f"{name}: {variable['name']} must come from a Secret"
            if secret:
                assert secret["name"].startswith("aegis-"), secret
    for key in [key for key in os.environ if key.startswith("AEGIS_")]:
        monkeypatch.delenv(key)
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    parsed = AegisSettings()
    assert parsed.health_host == "0.0.0.0" and parsed.health_port == 8081


def test_local_overlay_points_at_its_in_cluster_servers() -> None:
    docs = rendered("local")
    settings = settings_of(docs)
    services = of_kind(docs, "Service")
    for variable, port in (
        ("AEGIS_AWS_ENDPOINT_URL", 4566),
        ("AEGIS_MQTT_URL", 1883),
        ("AEGIS_NATS_URL", 4222),
    ):
        url = urlsplit(settings[variable])
        assert url.hostname in services, f"{variable}: no Service {url.hostname}"
        assert url.port in {p["port"] for p in services[url.hostname]["spec"]["ports"]}
        assert url.port == port
    (job,) = of_kind(docs, "Job").values()
    (container,) = pod_spec(job)["containers"]
    assert container["command"][:2] == ["aegis", "bootstrap"]
    assert "bootstrap" in WORKSPACE.aegis_commands(image_name(container["image"]))


def test_aws_overlay_uses_real_aws_through_irsa() -> None:
    docs = rendered("aws")
    settings = settings_of(docs)
    assert "AEGIS_AWS_ENDPOINT_URL" not in settings, "real S3/DynamoDB: no endpoint override"
    assert not [k for k in settings if k.startswith("AWS_")], "credentials come from IRSA"
    # the foundation comes from deploy/infra: the one Job makes the NATS streams, not storage
    jobs = of_kind(docs, "Job")
    assert set(jobs) == {"nats-streams"}
    assert pod_spec(jobs["nats-streams"])["containers"][0]["command"] == ["aegis", "streams"]
    accounts = of_kind(docs, "ServiceAccount")
    roles = {}
    for name in aegis_workloads(docs):
        arn = accounts[name]["metadata"].get("annotations", {}).get("eks.amazonaws.com/role-arn")
        assert arn and re.fullmatch(rf"arn:aws:iam::\d{{12}}:role/aegis-{name}", arn), (
            f"{name}: IRSA role {arn}"
        )
        roles[name] = arn
    assert len(set(roles.values())) == len(roles), "one role per service"
    for name, (_, container) in aegis_workloads(docs).items():
        assert "/" in container["image"] and ":" in container["image"], f"{name}: a registry"
    for target in ("base", "local"):
        for account in of_kind(rendered(target), "ServiceAccount").values():
            assert not account["metadata"].get("annotations"), f"{target}: no IRSA"


def test_nats_comes_from_its_official_helm_chart() -> None:
    (chart,) = aws_kustomization()["helmCharts"]
    assert {key: chart[key] for key in NATS_CHART} == NATS_CHART
    assert re.fullmatch(r"\d+\.\d+\.\d+", str(chart["version"])), "pin an exact chart version"
    assert chart["namespace"] == "aegis"
    values = chart["valuesInline"]
    assert values["config"]["jetstream"]["enabled"] is True
    assert values["config"]["jetstream"]["fileStore"]["pvc"]["enabled"] is True
    # the chart's client Service is named after the release: that is what the services dial
    nats_url = urlsplit(settings_of(rendered("aws"))["AEGIS_NATS_URL"])
    assert nats_url.hostname == chart["releaseName"] and nats_url.port == 4222
    assert "nats" not in workloads(rendered("aws")), "no home-made NATS beside the chart"
    for target in ("base", "local"):
        path = (K8S / "base") if target == "base" else (K8S / "overlays" / target)
        text = (path / "kustomization.yaml").read_text(encoding="utf-8")
        assert "helmCharts" not in yaml.safe_load(text)


def _env(container: Doc) -> dict[str, Doc]:
    return {variable["name"]: variable for variable in container.get("env", [])}


def test_every_aws_pod_is_its_own_nats_identity_over_tls() -> None:
    """Every service connects as the identity of aegis_contracts.bus named after it, its
    password from a Secret, over tls:// with the CA mounted, and may not manage streams; the one
    that may (the admin) is the nats-streams Job. The servers take TLS and those identities."""
    docs = rendered("aws")
    settings = settings_of(docs)
    assert urlsplit(settings["AEGIS_NATS_URL"]).scheme == "tls"
    assert settings["AEGIS_NATS_MANAGE_STREAMS"] == "false"
    pods = {name: pod_spec(w) for name, (w, _) in aegis_workloads(docs).items()}
    pods["nats-streams"] = pod_spec(of_kind(docs, "Job")["nats-streams"])
    for name, pod in pods.items():
        (container,) = pod["containers"]
        env = _env(container)
        user = env["AEGIS_NATS_USER"]["value"]
        assert user == (ADMIN if name == "nats-streams" else name), name
        assert user == ADMIN or user in IDENTITIES, f"{name}: no NATS identity {user}"
        secret = env["AEGIS_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert secret == {"name": "aegis-nats-passwords", "key": user}, name
        ca = Path(env["AEGIS_NATS_TLS_CA_FILE"]["value"])
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(ca.parent)]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"]["secretName"] == "aegis-nats-ca", name
        manage = env.get("AEGIS_NATS_MANAGE_STREAMS", {}).get("value", "false")
        assert manage == ("true" if user == ADMIN else "false"), name
    values = aws_kustomization()["helmCharts"][0]["valuesInline"]
    assert values["config"]["nats"]["tls"] == {"enabled": True, "secretName": "aegis-nats-tls"}
    include = values["config"]["merge"]["$include"]
    (mount,) = [
        p["value"] for p in values["container"]["patch"] if p["value"]["name"] == "nats-auth"
    ]
    (volume,) = [p["value"] for p in values["podTemplate"]["patch"]]
    assert include == f"..{mount['mountPath'].removeprefix('/etc')}/auth.conf"
    assert volume == {"name": "nats-auth", "secret": {"secretName": "aegis-nats-auth"}}


def test_ingest_keeps_one_mqtt_session_per_stable_pod_name() -> None:
    workload, container = aegis_workloads(rendered("base"))["ingest"]
    assert workload["kind"] == "StatefulSet"
    env = {v["name"]: v for v in container["env"]}
    assert env["AEGIS_MQTT_CLIENT_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_the_orchestrator_reads_optional_jobs_from_a_config_map() -> None:
    workload, container = aegis_workloads(rendered("base"))["orchestrator"]
    env = {v["name"]: v.get("value") for v in container["env"]}
    jobs_dir = str(Path(env["AEGIS_ORCHESTRATOR_JOBS_FILE"]).parent)
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == jobs_dir]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["optional"] is True


# -- network policies ----------------------------------------------------------------------------


def _selects(selector: Doc, labels: dict[str, str]) -> bool:
    """A label selector (matchLabels and In/NotIn/Exists expressions) against pod labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        present = key in labels
        ok = {
            "In": present and labels[key] in values,
            "NotIn": not present or labels[key] not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[op]
        if not ok:
            return False
    return True


def _peer_ok(peers: list[Doc] | None, labels: dict[str, str] | None) -> bool:
    """``from``/``to`` of a rule: absent = anyone; a pod peer (labels None: outside the
    namespace's pods, e.g. S3 or the broker) matches only ipBlock/namespace-wide peers."""
    if not peers:
        return True
    for peer in peers:
        same_namespace = "podSelector" in peer and "namespaceSelector" not in peer
        if same_namespace and labels is not None and _selects(peer["podSelector"], labels):
            return True
        if "ipBlock" in peer and labels is None:
            return True
    return False


def _port_ok(ports: list[Doc] | None, port: int) -> bool:
    return not ports or any(p.get("port") == port for p in ports)


def allowed(
    policies: list[Doc], src: dict[str, str] | None, dst: dict[str, str] | None, port: int
) -> bool:
    """Whether a TCP connection from pod ``src`` to pod ``dst`` on ``port`` is allowed (None: a
    party outside the namespace's pods): it must pass the source's egress and the destination's
    ingress, each allowed when no policy of that type selects the pod, or some rule matches."""

    def side(pod: dict[str, str] | None, kind: str, peer: dict[str, str] | None) -> bool:
        if pod is None:
            return True  # not ours to restrict
        chosen = [
            p["spec"]
            for p in policies
            if kind in p["spec"].get("policyTypes", []) and _selects(p["spec"]["podSelector"], pod)
        ]
        if not chosen:
            return True
        key, peers_key = ("egress", "to") if kind == "Egress" else ("ingress", "from")
        return any(
            _peer_ok(rule.get(peers_key), peer) and _port_ok(rule.get("ports"), port)
            for spec in chosen
            for rule in spec.get(key, [])
        )

    return side(src, "Egress", dst) and side(dst, "Ingress", src)


def pod_labels(docs: tuple[Doc, ...]) -> dict[str, dict[str, str]]:
    return {
        name: cast("dict[str, str]", w["spec"]["template"]["metadata"]["labels"])
        for name, w in of_kind(docs, *WORKLOAD_KINDS, "Job").items()
    }


@pytest.mark.parametrize("target", ["local", "aws"])
def test_network_policies_let_each_service_reach_only_what_it_uses(target: str) -> None:
    docs = rendered(target)
    policies = list(of_kind(docs, "NetworkPolicy").values())
    pods = pod_labels(docs)
    aegis = {n: labels for n, labels in pods.items() if n in aegis_workloads(docs)}
    nats = pods.get("nats", {"app.kubernetes.io/name": "nats"})  # aws: the chart's pods
    outside: dict[str, str] | None = None
    # everything refused unless allowed: a default deny of both directions for every pod
    assert any(
        p["spec"]["podSelector"] == {} and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        for p in policies
    )
    for name, labels in aegis.items():
        assert allowed(policies, labels, nats, 4222), f"{name} -> NATS"
        assert allowed(policies, labels, outside, 443), f"{name} -> AWS APIs over HTTPS"
        assert allowed(policies, labels, outside, 53), f"{name} -> DNS"
        assert not allowed(policies, labels, outside, 22), f"{name} -> ssh out"
        assert not allowed(policies, labels, outside, 6379), f"{name} -> anything else out"
        # nobody outside reaches a service, but its health port and the dashboard's page
        assert allowed(policies, outside, labels, 8081), f"probes and metrics -> {name}"
        assert allowed(policies, outside, labels, 8080) == (name == "dashboard-api"), name
        # the broker's services' listener: only the services that read MQTT
        mqtt = allowed(policies, labels, outside, 8884)
        assert mqtt == (name in {"ingest", "cloud-collector", "simulator"}), f"{name} -> MQTT"
    # NATS takes clients from the AEGIS pods only, never from outside the namespace's pods
    assert not allowed(policies, outside, nats, 4222)
    assert not allowed(policies, {"app.kubernetes.io/name": "stranger"}, nats, 4222)


def cron_pod(cron_job: Doc) -> Doc:
    return cast("Doc", cron_job["spec"]["jobTemplate"]["spec"]["template"]["spec"])


@pytest.mark.parametrize("target", TARGETS)
def test_scheduled_jobs_run_alone_locked_down_as_their_own_account(target: str) -> None:
    """The daily raw seal: never two runs at once, its own ServiceAccount (on AWS with the
    storage-tools IRSA role, its image from the registry), the same lock-down as the services."""
    docs = rendered(target)
    cron_jobs = of_kind(docs, "CronJob")
    assert set(cron_jobs) == {"seal-raw"}
    accounts = of_kind(docs, "ServiceAccount")
    for name, cron_job in cron_jobs.items():
        assert cron_job["spec"]["concurrencyPolicy"] == "Forbid", name
        pod = cron_pod(cron_job)
        assert pod["serviceAccountName"] == name and name in accounts, name
        assert pod["automountServiceAccountToken"] is False, name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        (container,) = pod["containers"]
        assert container["command"] == ["aegis", "seal", "raw"], name
        own = container["securityContext"]
        assert own["readOnlyRootFilesystem"] is True and own["capabilities"] == {"drop": ["ALL"]}
        assert set(container["resources"]["limits"]) >= {"cpu", "memory"}, name
        assert "seal" in WORKSPACE.aegis_commands("aegis-storage-tools"), "not in its image"
        annotations = accounts[name]["metadata"].get("annotations", {})
        if target == "aws":
            assert "/" in container["image"], f"{name}: a registry"
            role = annotations.get("eks.amazonaws.com/role-arn", "")
            assert role.endswith(":role/aegis-storage-tools"), f"{name}: IRSA role {role}"
        else:
            assert not annotations, name


def _all_pod_specs(docs: tuple[Doc, ...]) -> list[Doc]:
    """Pod specs of workloads, Jobs and CronJobs."""
    specs = [pod_spec(w) for w in of_kind(docs, *WORKLOAD_KINDS, "Job").values()]
    for cron in of_kind(docs, "CronJob").values():
        specs.append(cron["spec"]["jobTemplate"]["spec"]["template"]["spec"])
    return specs


def test_every_aws_image_has_a_repository_the_foundation_creates() -> None:
    """The aws overlay pulls each AEGIS image (services, Jobs, CronJobs) from ECR: each of those
    repositories is one deploy/infra's template creates, and every IAM role a ServiceAccount
    names is one the documented steps make (aegis-<service>, with the template's policy)."""
    template = yaml.load(
        (ROOT / "deploy" / "infra" / "foundation.yaml").read_text(encoding="utf-8"),
        Loader=_CloudFormationLoader,
    )
    resources = template["Resources"]
    repositories = {
        r["Properties"]["RepositoryName"]
        for r in resources.values()
        if r["Type"] == "AWS::ECR::Repository"
    }
    docs = rendered("aws")
    pulled = {
        image_name(c["image"])
        for spec in _all_pod_specs(docs)
        for c in [*spec.get("initContainers", []), *spec["containers"]]
        if ".dkr.ecr." in c["image"]
    }
    assert pulled, "the aws overlay pulls nothing from ECR"
    assert pulled <= repositories, f"no repository for {sorted(pulled - repositories)}"
    outputs = template["Outputs"]
    for account in of_kind(docs, "ServiceAccount").values():
        arn = account["metadata"].get("annotations", {}).get("eks.amazonaws.com/role-arn")
        if arn is None:
            continue
        role = arn.rsplit("/", 1)[1]
        assert role.startswith("aegis-"), role
        key = "".join(part.title() for part in role.removeprefix("aegis-").split("-"))
        assert f"{key}PolicyArn" in outputs, f"{role}: the template outputs no policy for it"


class _CloudFormationLoader(yaml.SafeLoader):
    """YAML with CloudFormation's short tags (!Ref, !Sub, ...), read as plain values."""


_CloudFormationLoader.add_multi_constructor(
    "!",
    lambda loader, _suffix, node: (
        loader.construct_scalar(node)
        if isinstance(node, yaml.ScalarNode)
        else loader.construct_sequence(node)
        if isinstance(node, yaml.SequenceNode)
        else loader.construct_mapping(node)
    ),
)
