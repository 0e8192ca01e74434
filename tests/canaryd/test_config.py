"""Loading canaryd.toml: defaults, environment overrides, and errors naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.config import Settings, load_settings
from canaryd.errors import ConfigError
from engine.config import FakeEngineConfig, TransformersEngineConfig


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "canaryd.toml"
    path.write_text(text)
    return path


class TestLoadSettings:
    def test_defaults_run_the_embedded_model_on_both_arms(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """No file: baseline autoregressive and prompt-lookup speculative on the embedded model."""
        monkeypatch.delenv("CANARYD_CONFIG", raising=False)
        settings = load_settings(None)
        assert isinstance(settings.arms.baseline, TransformersEngineConfig)
        assert settings.arms.baseline.speculative is None
        assert isinstance(settings.arms.speculative, TransformersEngineConfig)
        assert settings.arms.speculative.speculative is not None
        assert settings.arms.speculative.speculative.method == "prompt_lookup"

    def test_engine_kind_selects_the_config_model(self, tmp_path: Path) -> None:
        """`kind = "fake"` picks the fake engine's settings."""
        path = write(tmp_path, '[arms.speculative]\nkind = "fake"\nspeculative = true\n')
        assert isinstance(load_settings(path).arms.speculative, FakeEngineConfig)

    def test_environment_overrides_the_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """CANARYD_PROMPTS__MAX_TOKENS beats the file's prompts.max_tokens."""
        path = write(tmp_path, "[prompts]\nmax_tokens = 32\nseed = 5\n")
        monkeypatch.setenv("CANARYD_PROMPTS__MAX_TOKENS", "16")
        settings = load_settings(path)
        assert settings.prompts.max_tokens == 16
        assert settings.prompts.seed == 5

    def test_unknown_key_names_file_and_key(self, tmp_path: Path) -> None:
        """A misspelt key is an error naming the file and the dotted key."""
        path = write(tmp_path, "[prompts]\nmax_tokenz = 32\n")
        with pytest.raises(ConfigError) as info:
            load_settings(path)
        assert str(info.value).startswith(f"{path}: prompts.max_tokenz:")

    def test_bad_value_names_key_and_value(self, tmp_path: Path) -> None:
        """A value of the wrong type names the key and echoes the value."""
        path = write(tmp_path, '[prompts]\ntemperature = "hot"\n')
        with pytest.raises(ConfigError, match=r"prompts\.temperature: .*'hot'"):
            load_settings(path)

    def test_toml_syntax_error_names_the_line(self, tmp_path: Path) -> None:
        """Broken TOML reports the file and the line."""
        path = write(tmp_path, "[prompts]\nseed = = 1\n")
        with pytest.raises(ConfigError, match=r"\(syntax\): .*line 2"):
            load_settings(path)

    def test_unknown_section(self, tmp_path: Path) -> None:
        """A section canaryd does not know is named, with the ones it does."""
        path = write(tmp_path, "[prompt]\nseed = 1\n")
        with pytest.raises(ConfigError, match=r"prompt: unknown section; expected one of"):
            load_settings(path)

    def test_missing_file(self, tmp_path: Path) -> None:
        """A config path that does not exist is an error, not silently the defaults."""
        with pytest.raises(ConfigError, match="no such file"):
            load_settings(tmp_path / "absent.toml")

    def test_speculative_method_needs_its_fields(self, tmp_path: Path) -> None:
        """early_exit without a layer count names the speculative section."""
        path = write(tmp_path, '[arms.speculative.speculative]\nmethod = "early_exit"\n')
        with pytest.raises(
            ConfigError, match=r"arms\.speculative\.speculative: .*early_exit_layer"
        ):
            load_settings(path)

    def test_config_hash_follows_content(self, tmp_path: Path) -> None:
        """Two different configs hash differently; the same config hashes the same."""
        a = load_settings(write(tmp_path, "[prompts]\nseed = 1\n"))
        b = load_settings(write(tmp_path, "[prompts]\nseed = 2\n"))
        assert a.config_hash() != b.config_hash()
        assert (
            a.config_hash() == load_settings(write(tmp_path, "[prompts]\nseed = 1\n")).config_hash()
        )


@pytest.fixture
def no_locations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No URL, config or state file from the environment; the data directory in tmp_path."""
    for name in (
        "CANARYD_DATABASE_URL",
        "CANARYD_STORAGE__URL",
        "CANARYD_CONFIG",
        "CANARYD_SWITCH__STATE_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


class TestDatabaseUrl:
    def test_default_is_the_sqlite_file_in_the_data_dir(self, no_locations: Path) -> None:
        assert load_settings(None).storage.resolved_url() == f"sqlite:///{no_locations}/canaryd.db"

    def test_database_url_env_beats_the_default(
        self, no_locations: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("CANARYD_DATABASE_URL", "sqlite:////env.db")
        assert load_settings(None).storage.resolved_url() == "sqlite:////env.db"

    def test_storage_url_beats_the_database_url_env(
        self, no_locations: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """storage.url from the file, or from CANARYD_STORAGE__URL, comes before
        CANARYD_DATABASE_URL; CANARYD_STORAGE__URL overrides the file."""
        monkeypatch.setenv("CANARYD_DATABASE_URL", "sqlite:////env.db")
        path = write(tmp_path, '[storage]\nurl = "sqlite:////file.db"\n')
        assert load_settings(path).storage.resolved_url() == "sqlite:////file.db"
        monkeypatch.setenv("CANARYD_STORAGE__URL", "sqlite:////storage-env.db")
        assert load_settings(path).storage.resolved_url() == "sqlite:////storage-env.db"

    def test_explicit_url_beats_everything(
        self, no_locations: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("CANARYD_DATABASE_URL", "sqlite:////env.db")
        monkeypatch.setenv("CANARYD_STORAGE__URL", "sqlite:////storage-env.db")
        storage = load_settings(None).storage
        assert storage.resolved_url("sqlite:////flag.db") == "sqlite:////flag.db"
        assert storage.resolved_url(None) == "sqlite:////storage-env.db"


class TestStateFile:
    def test_default_is_switch_json_in_the_data_dir(self, no_locations: Path) -> None:
        assert load_settings(None).switch.resolved_state_file() == no_locations / "switch.json"

    def test_configured_path_beats_the_default(
        self, no_locations: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """switch.state_file from the file, overridden by CANARYD_SWITCH__STATE_FILE."""
        path = write(tmp_path, f'[switch]\nstate_file = "{tmp_path / "file.json"}"\n')
        assert load_settings(path).switch.resolved_state_file() == tmp_path / "file.json"
        monkeypatch.setenv("CANARYD_SWITCH__STATE_FILE", str(tmp_path / "env.json"))
        assert load_settings(path).switch.resolved_state_file() == tmp_path / "env.json"


class TestNonFiniteValues:
    @pytest.mark.parametrize(
        ("section", "key", "value"),
        [
            ("gates.policy", "cooldown_seconds", "inf"),
            ("gates.error", "window_seconds", "nan"),
            ("storage", "raw_retention_days", "inf"),
            ("schedule", "pair_interval_s", "-inf"),
        ],
    )
    def test_inf_and_nan_are_refused_naming_the_key(
        self, tmp_path: Path, section: str, key: str, value: str
    ) -> None:
        """`inf`/`nan` in a policy, window, retention or schedule value fail at load with
        one line naming the file and the key (an infinite cooldown would disarm the
        switch for ever)."""
        path = write(tmp_path, f"[{section}]\n{key} = {value}\n")
        with pytest.raises(ConfigError) as caught:
            load_settings(path)
        message = str(caught.value)
        assert message.startswith(f"{path}: {section}.{key}: ")
        assert "finite" in message
        assert "\n" not in message

    def test_the_cli_exits_2_on_an_infinite_cooldown(self, tmp_path: Path) -> None:
        """`canaryd status --config` with `cooldown_seconds = inf`: exit 2, the key named."""
        path = write(tmp_path, "[gates.policy]\ncooldown_seconds = inf\n")
        result = CliRunner().invoke(app, ["status", "--config", str(path)])
        assert result.exit_code == 2
        assert "gates.policy.cooldown_seconds" in result.output


class TestUpperBounds:
    @pytest.mark.parametrize(
        ("section", "key", "value"),
        [
            ("gates.policy", "cooldown_seconds", "1e12"),
            ("gates.policy", "latch_window_seconds", "1e15"),
            ("gates.liveness", "window_seconds", "1e12"),
            ("schedule", "gate_interval_s", "31622401"),
            ("storage", "rollup_retention_days", "3661"),
            ("gates.liveness", "window_pairs", "10000000000"),
        ],
    )
    def test_durations_and_counts_beyond_sanity_are_refused(
        self, tmp_path: Path, section: str, key: str, value: str
    ) -> None:
        """A duration beyond 366 days (retention: ten years) or a count beyond a billion
        is a typo: refused at load in one line naming the file and the key (a cooldown
        of 1e12 s made every gate run raise, which disarmed the switch)."""
        path = write(tmp_path, f"[{section}]\n{key} = {value}\n")
        with pytest.raises(ConfigError) as caught:
            load_settings(path)
        message = str(caught.value)
        assert message.startswith(f"{path}: {section}.{key}: "), message
        assert "a typo?" in message and "\n" not in message

    def test_the_largest_sane_values_load(self, tmp_path: Path) -> None:
        """366 days and ten years of retention are still accepted."""
        path = write(
            tmp_path,
            "[gates.policy]\ncooldown_seconds = 31622400\n"
            "[storage]\nrollup_retention_days = 3660\n",
        )
        assert load_settings(path).gates.policy.cooldown_seconds == 31622400

    def test_a_value_from_the_environment_names_its_variable(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`CANARYD_GATES__LIVENESS__WINDOW_SECONDS=1e12`: the CLI exits 2 and names the
        variable, not a TOML file the operator would search in vain."""
        monkeypatch.setenv("CANARYD_GATES__LIVENESS__WINDOW_SECONDS", "1e12")
        result = CliRunner().invoke(app, ["gates"])
        assert result.exit_code == 2
        assert (
            "environment CANARYD_GATES__LIVENESS__WINDOW_SECONDS: "
            "gates.liveness.window_seconds: 1e+12 is too long" in result.output
        )


THREE_ARMS = """
[arms.baseline]
kind = "fake"
[arms.hydra]
kind = "fake"
speculative = true
[arms.medusa]
kind = "fake"
speculative = true
"""


class TestArms:
    def test_any_number_of_named_speculative_arms(self, tmp_path: Path) -> None:
        """Every `[arms.<name>]` but `baseline` is a speculative arm; `switch.arm` names the
        one the switch controls and the others are comparison arms."""
        settings = load_settings(write(tmp_path, THREE_ARMS + '[switch]\narm = "medusa"\n'))
        assert settings.arms.names == ["baseline", "hydra", "medusa"]
        assert list(settings.arms.speculative_arms) == ["hydra", "medusa"]
        assert settings.switch_arm == "medusa"
        assert settings.comparison_arms == ["hydra"]
        assert isinstance(settings.arms.arm("hydra"), FakeEngineConfig)

    def test_one_speculative_arm_is_the_switch_arm(self, tmp_path: Path) -> None:
        """With one speculative arm, whatever its name, `switch.arm` may stay unset."""
        settings = load_settings(write(tmp_path, '[arms.hydra]\nkind = "fake"\n'))
        assert settings.arms.names == ["baseline", "hydra"]
        assert settings.switch_arm == "hydra" and settings.comparison_arms == []

    def test_the_default_speculative_arm_is_added_only_when_none_is_named(
        self, tmp_path: Path
    ) -> None:
        """A file naming only the baseline keeps the default `speculative` arm, and the
        snapshot of the defaults is what it always was (baseline, then speculative)."""
        settings = load_settings(write(tmp_path, '[arms.baseline]\nkind = "fake"\n'))
        assert settings.arms.names == ["baseline", "speculative"]
        assert settings.switch_arm == "speculative"
        assert list(Settings().snapshot()["arms"]) == ["baseline", "speculative"]

    def test_several_arms_need_switch_arm(self, tmp_path: Path) -> None:
        """Two speculative arms and no `switch.arm` is one line naming the key and the arms."""
        path = write(tmp_path, THREE_ARMS)
        with pytest.raises(ConfigError) as info:
            load_settings(path)
        assert str(info.value) == (
            f"{path}: switch.arm: unset, but there are 2 speculative arms (hydra, medusa): "
            "name the one whose rollback the switch controls"
        )

    def test_switch_arm_must_name_a_speculative_arm(self, tmp_path: Path) -> None:
        """`switch.arm` naming the baseline or an unknown arm lists the arms it may name."""
        for name in ("baseline", "eagle"):
            path = write(tmp_path, THREE_ARMS + f'[switch]\narm = "{name}"\n')
            with pytest.raises(ConfigError) as info:
                load_settings(path)
            assert str(info.value) == (
                f"{path}: switch.arm: names no speculative arm; expected one of hydra, "
                f"medusa (got {name!r})"
            )

    def test_control_arm_must_name_an_extra_arm(self, tmp_path: Path) -> None:
        """`gates.quality.control_arm` (the A/A control) names an extra arm that is not
        the switch's; an unknown one, or the switch arm itself, is refused under its key."""
        good = load_settings(
            write(
                tmp_path,
                THREE_ARMS + '[switch]\narm = "hydra"\n[gates.quality]\ncontrol_arm = "medusa"\n',
            )
        )
        assert good.gates.quality.control_arm == "medusa"
        for name in ("hydra", "twin"):
            path = write(
                tmp_path,
                THREE_ARMS + f'[switch]\narm = "hydra"\n[gates.quality]\ncontrol_arm = "{name}"\n',
            )
            with pytest.raises(ConfigError) as info:
                load_settings(path)
            assert str(info.value).startswith(
                f"{path}: gates.quality.control_arm: names no extra arm; configure "
                f"[arms.{name}] exactly like the baseline"
            ), str(info.value)

    def test_bad_arm_name_names_the_key(self, tmp_path: Path) -> None:
        """An arm name that is no lower-case identifier is refused under its own key."""
        path = write(tmp_path, '[arms."Hydra-2"]\nkind = "fake"\n')
        with pytest.raises(ConfigError) as info:
            load_settings(path)
        assert str(info.value).startswith(f"{path}: arms.Hydra-2: an arm name is a lower-case")

    def test_an_arm_called_like_an_engine_kind_keeps_its_name_in_errors(
        self, tmp_path: Path
    ) -> None:
        """An arm called `fake` (an engine kind) is still named in the key of its error."""
        path = write(tmp_path, '[arms.fake]\nkind = "fake"\nbogus = 1\n')
        with pytest.raises(ConfigError, match=r": arms\.fake\.bogus: "):
            load_settings(path)

    def test_switch_arm_from_the_environment(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """CANARYD_SWITCH__ARM picks the switch's arm like the file does."""
        monkeypatch.setenv("CANARYD_SWITCH__ARM", "hydra")
        settings = load_settings(write(tmp_path, THREE_ARMS))
        assert settings.switch_arm == "hydra" and settings.comparison_arms == ["medusa"]
