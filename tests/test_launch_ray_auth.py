"""A client that cannot join a token-auth cluster is told how to fix it, in one line.

Ray's own failures are a bare AuthenticationError (token mode on, no token found) or, with token
mode off against a token head, "Failed to connect" after ~20 s of retries. `join_cluster` (used by
`python -m actors.fleet` and `launch/ray_cluster.connect`) turns both into a message naming
RAY_AUTH_MODE=token or where the token is read from. Ray is faked here; test_launch_ray_job.py
meets a real token head.
"""

import pytest
import ray
from ray.exceptions import AuthenticationError

from actors import fleet
from launch import ray_cluster
from launch.config import ConfigError


def failing_init(error: Exception):
    def init(*args, **kwargs):
        raise error

    return init


@pytest.fixture
def no_token_mode(monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setattr(ray, "init", failing_init(ConnectionError("Failed to connect to Ray cluster at 1.2.3.4:6379")))


def test_token_mode_off_names_the_export(no_token_mode):
    with pytest.raises(fleet.ClusterUnreachable) as caught:
        fleet.join_cluster("1.2.3.4:6379")
    message = str(caught.value)
    assert "Failed to connect" in message and "RAY_AUTH_MODE is unset" in message
    assert "export RAY_AUTH_MODE=token" in message


def test_token_mode_on_without_the_token_names_where_it_is_read(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setattr(ray, "init", failing_init(AuthenticationError("no authentication token was found")))
    with pytest.raises(fleet.ClusterUnreachable) as caught:
        fleet.join_cluster("auto")
    message = str(caught.value)
    assert "no authentication token was found" in message
    assert all(source in message for source in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "~/.ray/auth_token"))
    assert "export RAY_AUTH_MODE" not in message


def test_no_cluster_found_gets_no_token_advice(no_token_mode, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "init", failing_init(ConnectionError("Could not find any running Ray instance.")))
    with pytest.raises(fleet.ClusterUnreachable) as caught:
        fleet.join_cluster("auto")
    assert str(caught.value) == "cannot join the Ray cluster at 'auto': Could not find any running Ray instance"


def test_fleet_cli_exits_with_the_message_not_a_traceback(no_token_mode):
    with pytest.raises(SystemExit) as caught:
        fleet.main(["--close", "--address", "1.2.3.4:6379"])
    assert str(caught.value).startswith("error: cannot join the Ray cluster at '1.2.3.4:6379'")
    assert caught.value.__suppress_context__


def test_an_entrypoint_joining_by_address_fails_as_a_config_error(no_token_mode, monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(ConfigError, match="ray_address / RAY_ADDRESS: cannot join .*export RAY_AUTH_MODE=token"):
        ray_cluster.connect("1.2.3.4:6379")
