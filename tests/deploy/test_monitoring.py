"""deploy/prometheus.yml, deploy/alerts.yml and deploy/grafana: they scrape the ports the services serve on,
the dashboard and the alerts query metrics the code exports, and promtool (where installed) accepts the
queries and shows each alert firing (tests/deploy/alerts_test.yml; promtool is skipped where it is missing, but not
under CI=true)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from support.tools import required_command

from rlgate.learner.metrics import LearnerMetrics
from rlgate.server.metrics import ServerMetrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROMETHEUS = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
ALERTS = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
GRAFANA = DEPLOY / "grafana"
DASHBOARD = json.loads((GRAFANA / "dashboards" / "rlgate.json").read_text())
DATASOURCES = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
DASHBOARD_PROVIDERS = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "rlgate.yml").read_text())


def exported_sample_names() -> set[str]:
    """Every sample name the server and learner registries expose (prometheus_client's suffixes added)."""
    suffixes = {"counter": ["_total"], "gauge": [""], "histogram": ["_bucket", "_sum", "_count"]}
    server = ServerMetrics()
    server.report_pause(lambda: None)  # a running server registers rlgate_paused{reason}
    families = [*server.registry.collect(), *LearnerMetrics().registry.collect()]
    return {family.name + suffix for family in families for suffix in suffixes[family.type]}


def dashboard_queries() -> list[str]:
    return [target["expr"] for panel in DASHBOARD["panels"] for target in panel["targets"]]


def alert_rules() -> dict[str, str]:
    return {rule["alert"]: rule["expr"] for group in ALERTS["groups"] for rule in group["rules"]}


def scrape_config(job: str) -> dict[str, Any]:
    (config,) = [config for config in PROMETHEUS["scrape_configs"] if config["job_name"] == job]
    return config


def test_prometheus_scrapes_every_service_on_its_http_port(containers: dict) -> None:
    learner, inference = containers["learner"].settings, containers["inference"].settings
    assert scrape_config("learner")["static_configs"] == [{"targets": [f"learner:{learner.http_port}"]}]
    (replicas,) = scrape_config("inference")["dns_sd_configs"]
    assert replicas["names"] == ["inference"]  # one A record per replica, so scaling needs no change here
    assert replicas["type"] == "A"
    assert replicas["port"] == inference.http_port


def test_promtool_accepts_the_prometheus_config() -> None:
    promtool = required_command("promtool", "prometheus")
    result = subprocess.run([promtool, "check", "config", DEPLOY / "prometheus.yml"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_queries_are_promql(tmp_path: Path) -> None:
    """promtool parses each query as a recording rule ($__rate_interval is Grafana's, so it is filled in)."""
    promtool = required_command("promtool", "prometheus")
    rules = [
        {"record": f"rlgate:query{i}", "expr": query.replace("$__rate_interval", "1m")}
        for i, query in enumerate(dashboard_queries())
    ]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_queries_name_exported_metrics() -> None:
    named = {name for query in dashboard_queries() for name in re.findall(r"\brlgate_\w+", query)}
    assert named <= exported_sample_names(), named - exported_sample_names()
    # What an operator looks at first: steps/s, batch size, latency, return, model version...
    assert {
        "rlgate_env_steps_total",
        "rlgate_batch_size_bucket",
        "rlgate_step_latency_seconds_bucket",
        "rlgate_learner_mean_return",
        "rlgate_model_version",
        "rlgate_learner_model_version",
    } <= named
    # ...and what tells why: rejected calls by status, losses, entropy, KL, staleness and dropped steps, acked
    # vs spooled, paused state, spool fill against its limit, CPU per stage, the learner's intake.
    assert {
        "rlgate_rejected_total",
        "rlgate_learner_policy_loss",
        "rlgate_learner_vf_loss",
        "rlgate_learner_entropy",
        "rlgate_learner_kl",
        "rlgate_learner_staleness",
        "rlgate_learner_stale_steps_total",
        "rlgate_learner_duplicates_total",
        "rlgate_acked_batches_total",
        "rlgate_spool_batches",
        "rlgate_paused",
        "rlgate_spool_bytes",
        "rlgate_spool_max_bytes",
        "rlgate_stage_seconds_total",
        "rlgate_learner_pending_steps",
        "rlgate_learner_failed_updates_total",
    } <= named


def test_dashboard_panels_do_not_overlap() -> None:
    cells = [
        (x, y)
        for panel in DASHBOARD["panels"]
        for x in range(panel["gridPos"]["x"], panel["gridPos"]["x"] + panel["gridPos"]["w"])
        for y in range(panel["gridPos"]["y"], panel["gridPos"]["y"] + panel["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells))
    assert len({panel["id"] for panel in DASHBOARD["panels"]}) == len(DASHBOARD["panels"])


def test_alerts_cover_what_an_operator_must_hear_about() -> None:
    """Learner down, spool near full, bad input (NaN) rejected, no new weights; on metrics the code exports."""
    rules = alert_rules()
    assert set(rules) >= {
        "RlgateLearnerDown",
        "RlgateSpoolNearlyFull",
        "RlgateInvalidInputRejected",
        "RlgateNoNewWeights",
    }
    named = {name for expr in rules.values() for name in re.findall(r"\brlgate_\w+", expr)}
    assert named <= exported_sample_names(), named - exported_sample_names()
    jobs = {job for expr in rules.values() for job in re.findall(r'job="(\w+)"', expr)}
    assert jobs <= {config["job_name"] for config in PROMETHEUS["scrape_configs"]}


def test_prometheus_loads_the_alerts_where_compose_mounts_them(services: dict[str, dict[str, Any]]) -> None:
    mounts = dict(volume.split(":")[:2] for volume in services["prometheus"]["volumes"])
    config = Path(mounts["./prometheus.yml"])
    assert PROMETHEUS["rule_files"] == ["alerts.yml"]  # relative to the config file
    assert Path(mounts["./alerts.yml"]) == config.parent / "alerts.yml"


def test_promtool_shows_each_alert_firing() -> None:
    """promtool's rule unit tests: every alert fires on its failure and stays quiet on a healthy deployment."""
    promtool = required_command("promtool", "prometheus")
    tests = Path(__file__).parent / "alerts_test.yml"
    covered = {
        test["alertname"] for case in yaml.safe_load(tests.read_text())["tests"] for test in case["alert_rule_test"]
    }
    assert covered == set(alert_rules())
    result = subprocess.run([promtool, "test", "rules", tests], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_uses_the_provisioned_datasource() -> None:
    (datasource,) = DATASOURCES["datasources"]
    assert datasource["url"] == "http://prometheus:9090"
    for panel in DASHBOARD["panels"]:
        for source in (panel["datasource"], *(target["datasource"] for target in panel["targets"])):
            assert source == {"type": datasource["type"], "uid": datasource["uid"]}, panel["title"]


def test_grafana_mounts_what_it_provisions(services: dict[str, dict[str, Any]]) -> None:
    """The provider's folder is where compose mounts deploy/grafana/dashboards; the home dashboard is in it."""
    grafana = services["grafana"]
    mounts = dict(volume.split(":")[:2] for volume in grafana["volumes"])
    dashboards = Path(mounts["./grafana/dashboards"])
    (provider,) = DASHBOARD_PROVIDERS["providers"]
    assert Path(provider["options"]["path"]) == dashboards
    assert Path(mounts["./grafana/provisioning"]) == Path("/etc/grafana/provisioning")
    home = Path(grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert home.parent == dashboards
    assert (GRAFANA / "dashboards" / home.name).is_file()
