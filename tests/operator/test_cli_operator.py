"""`guardedcron operator`'s settings: environment (as the chart sets it), flags, errors."""

from __future__ import annotations

import argparse

import pytest

from guardedcron.cli.operator import add_parser, settings_from
from guardedcron.spec import Settings, SettingsError, settings_from_env
from guardedcron.spec.settings import priority_from_ip
from tests.support import run_cli


def flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(), "operator", "")
    return parser.parse_args(["operator", *argv])


BUILD = settings_from_env({})  # what goes into CronJobs: the defaults throughout


def test_defaults_are_cluster_wide_standalone_with_metrics() -> None:
    assert settings_from({}) == Settings(build=BUILD, namespaces=(), peering=None, priority=0,
                                         metrics_port=9090, log_level="info", liveness=None)


def test_the_charts_environment_with_peering() -> None:
    env = {"GUARDEDCRON_NAMESPACES": "billing, shop,billing", "GUARDEDCRON_PEERING": "guardedcron",
           "GUARDEDCRON_PRIORITY": "pod-ip", "GUARDEDCRON_POD_IP": "10.1.2.3",
           "GUARDEDCRON_METRICS_PORT": "9090", "GUARDEDCRON_LOG_LEVEL": "WARNING"}
    options = settings_from(env, flags("--liveness=http://0.0.0.0:8080/healthz"))
    assert options == Settings(build=BUILD, namespaces=("billing", "shop"), peering="guardedcron",
                               priority=(10 << 24) + (1 << 16) + (2 << 8) + 3, metrics_port=9090,
                               log_level="warning", liveness="http://0.0.0.0:8080/healthz")


def test_an_empty_peering_name_is_standalone() -> None:
    assert settings_from({"GUARDEDCRON_PEERING": ""}).peering is None


def test_flags_win_over_the_environment() -> None:
    env = {"GUARDEDCRON_NAMESPACES": "a", "GUARDEDCRON_PEERING": "p", "GUARDEDCRON_PRIORITY": "5",
           "GUARDEDCRON_METRICS_PORT": "9090", "GUARDEDCRON_LOG_LEVEL": "info"}
    options = settings_from(env, flags("-n", "b", "-n", "c", "--standalone", "--priority", "7",
                                       "--metrics-port", "0", "--log-level", "debug"))
    assert options == Settings(build=BUILD, namespaces=("b", "c"), peering=None, priority=7,
                               metrics_port=0, log_level="debug", liveness=None)


@pytest.mark.parametrize(("address", "priority"), [
    ("0.0.0.1", 1), ("255.255.255.255", 2**32 - 1), ("fd00::1:2", (1 << 16) + 2),
    ("fd00::ffff:ffff", 2**31 - 1),
])
def test_priority_from_the_pod_ip(address: str, priority: int) -> None:
    assert priority_from_ip(address) == priority


def test_every_bad_setting_is_named() -> None:
    env = {"GUARDEDCRON_NAMESPACES": "ok,Not_A_Namespace", "GUARDEDCRON_PRIORITY": "pod-ip",
           "GUARDEDCRON_POD_IP": "", "GUARDEDCRON_METRICS_PORT": "http", "GUARDEDCRON_LOG_LEVEL": "loud"}
    with pytest.raises(SettingsError) as caught:
        settings_from(env)
    assert [p.field_path for p in caught.value.problems] == [
        "GUARDEDCRON_NAMESPACES", "GUARDEDCRON_POD_IP", "GUARDEDCRON_METRICS_PORT", "GUARDEDCRON_LOG_LEVEL"]


def test_a_bad_priority_flag_is_named() -> None:
    with pytest.raises(SettingsError, match="--priority: must be an integer or pod-ip"):
        settings_from({}, flags("--priority", "high"))


def test_the_command_exits_64_on_bad_settings_without_starting() -> None:
    result = run_cli(["operator", "--metrics-port", "70000"],
                     env={"GUARDEDCRON_GUARD_IMAGE": "bad image", "KUBECONFIG": "/nonexistent"})
    assert result.code == 64
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "guardedcron operator: --metrics-port: must be a port number 0-65535 (0: off), not '70000'",
        "guardedcron operator: GUARDEDCRON_GUARD_IMAGE: 'bad image' is not an image reference"]


def test_the_switches_for_stopping_workloads_and_recording_outcomes() -> None:
    options = settings_from({"GUARDEDCRON_STOP_WORKLOAD": "true", "GUARDEDCRON_OUTCOME_RECORDING": "False"})
    assert (options.stop_workload, options.outcome_recording) == (True, False)
    assert settings_from({"GUARDEDCRON_OUTCOME_RECORDING": " TRUE "}).outcome_recording is True
    with pytest.raises(SettingsError) as error:
        settings_from({"GUARDEDCRON_STOP_WORKLOAD": "yes", "GUARDEDCRON_OUTCOME_RECORDING": "1"})
    assert [p.field_path for p in error.value.problems] == ["GUARDEDCRON_STOP_WORKLOAD",
                                                       "GUARDEDCRON_OUTCOME_RECORDING"]
