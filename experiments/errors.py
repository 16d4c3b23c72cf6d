"""What the command line prints for an error the user can fix: one line, no traceback.

:func:`user_message` turns the errors of a bad config (Hydra's and ours), a bad
profile, trace or acceptance log into one line that names the key or file, the
value and what is valid; anything else is a bug and keeps its traceback.
``HYDRA_FULL_ERROR=1`` shows the full traceback of every error.
"""

from __future__ import annotations

import os
import re
import sys
from typing import NoReturn

from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from experiments.schema import ConfigError
from simulator import ProfileError
from simulator.acceptance.logs import LogError
from simulator.checks import SpecError
from traces.replay import ZeroOutputError
from traces.rows import TraceFormatError, TraceRowError

DEBUG_ENV = "HYDRA_FULL_ERROR"
EXIT_CODE = 2  # like argparse: the command was given bad input

#: Errors in the config and the input files; one line whenever they are raised.
INPUT_ERRORS = (ConfigError, SpecError, ProfileError, LogError, TraceFormatError, TraceRowError, ZeroOutputError,
                FileNotFoundError)

_TYPES = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "String": "a string"}


def debug_requested() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _unknown_key(err: ConfigAttributeError | ConfigKeyError) -> str:
    parent = err.parent_node
    valid = [str(k) for k in parent.keys() if k != "hydra"] if isinstance(parent, DictConfig) else []
    listed = f"; valid keys: {', '.join(valid)}" if valid else ""
    return f"{err.full_key}: unknown key{listed}"


def _composition_message(err: ConfigCompositionException) -> str:
    cause = err.__cause__
    override = re.search(r"merging override (\S+)", str(err))
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.parent_node is not None:
        return _unknown_key(cause)
    if isinstance(cause, ValidationError):
        wanted = re.search(r"could not be converted to (\w+)", str(cause))
        if wanted and override:
            line, kind = override.group(1), _TYPES.get(wanted.group(1), wanted.group(1))
            named = "" if line.lstrip("+~").startswith(f"{cause.full_key}=") else f"{cause.full_key} "
            return f"{line}: {named}must be {kind}"
    first = str(err).splitlines()[0]
    return _one_line(f"{first} ({str(cause).splitlines()[0]})" if cause is not None else first)


def user_message(err: BaseException, setup: bool = False) -> str | None:
    """One line for an error the user can fix (``setup``: raised while a config becomes a spec, where any
    ``ValueError`` is about the input); None for anything else."""
    if isinstance(err, MissingConfigException):
        missing = re.search(r"Could not find '(.+)/([^/']+)'", str(err))
        if missing and err.options:
            group, option = missing.groups()
            return f"{group}={option}: no such option; available: {', '.join(err.options)}"
        return _one_line(str(err).split("Config search path")[0])
    if isinstance(err, ConfigCompositionException):
        return _composition_message(err)
    if isinstance(err, (HydraException, OmegaConfBaseException)):
        return _one_line(str(err).splitlines()[0])
    if isinstance(err, INPUT_ERRORS) or (setup and isinstance(err, ValueError)):
        return _one_line(str(err))
    return None


def exit_with(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(EXIT_CODE)
