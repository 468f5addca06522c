"""The GuardedCronJob spec parsed into typed values, with the checks CEL cannot do (pure)."""

from guardedcron.spec.defaults import apply_schema_defaults
from guardedcron.spec.errors import Problem, SpecError
from guardedcron.spec.model import (
    DatabaseTls,
    GuardedCronJobSpec,
    LeaseSpec,
    OnLost,
    ParsedSpec,
    SecretKeyRef,
)
from guardedcron.spec.parse import parse_guarded_cronjob
from guardedcron.spec.settings import (
    DEFAULT_NO_SUCCESS_SLOTS,
    Flags,
    GuardResources,
    OperatorSettings,
    Settings,
    SettingsError,
    read_settings,
    settings_from_env,
)

__all__ = [
    "DEFAULT_NO_SUCCESS_SLOTS",
    "DatabaseTls",
    "Flags",
    "GuardResources",
    "GuardedCronJobSpec",
    "LeaseSpec",
    "OnLost",
    "OperatorSettings",
    "ParsedSpec",
    "Problem",
    "SecretKeyRef",
    "Settings",
    "SettingsError",
    "SpecError",
    "apply_schema_defaults",
    "parse_guarded_cronjob",
    "read_settings",
    "settings_from_env",
]
