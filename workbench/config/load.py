"""Reading settings into a ``RunConfig``: a TOML file's ``[run]`` table, ``--set KEY=VALUE``
strings (each parsed to its knob's type, taken exactly as typed), and a resumed run's
recorded config (what it may change). Every bad or unknown setting is reported at once."""
from __future__ import annotations

import difflib
import os
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from workbench.config.kinds import (ONE_START, RESUMABLE, ConfigError, Stride, default_of,
                                    read_stride, resolve_type)
from workbench.config.run import RunConfig


def parse_value(name: str, text: str) -> Any:
    """Turn a ``--set`` string into the field's type; unknown fields are reported by name."""
    known = {f.name: resolve_type(f.type) for f in fields(RunConfig)}
    if name not in known:
        raise ConfigError([unknown_setting(name)])
    t = known[name]
    try:
        if t is Stride:
            value = read_stride(text)
            if value != "auto" and not isinstance(value, int):
                raise ValueError
            return value
        if t is bool:
            low = text.strip().lower()
            if low not in ("true", "false", "1", "0", "on", "off", "yes", "no"):
                raise ValueError
            return low in ("true", "1", "on", "yes")
        if t is int:
            number = float(text)  # accepts 1e6 as well as 1000000
            if not number.is_integer():
                raise ValueError
            return int(number)
        if t is float:
            return float(text)
    except ValueError:
        kind = {bool: "true or false", int: "a whole number", float: "a number",
                Stride: "'auto' or a non-zero whole number"}[t]
        raise ConfigError([f"{name}: {text!r} is not {kind}"]) from None
    return text


def load_config(path: str | os.PathLike | None = None, overrides: Mapping[str, Any] | None = None,
                base: RunConfig | None = None) -> RunConfig:
    """Build a config from an optional TOML file, then ``overrides`` (strings are parsed).

    Raises:
        ConfigError: listing every bad or unknown setting at once.
    """
    values: dict[str, Any] = dict(base.to_dict()) if base else {}
    problems: list[str] = []
    if path is not None:
        values.update(read_settings(Path(path)))
    for key, raw in (overrides or {}).items():
        try:
            values[key] = parse_value(key, raw) if isinstance(raw, str) else raw
        except ConfigError as e:
            problems += e.problems
    known = {f.name for f in fields(RunConfig)}
    problems += [unknown_setting(k) for k in values if k not in known]
    if problems:
        raise ConfigError(problems)
    return RunConfig(**values)


def read_settings(path: Path) -> dict[str, Any]:
    """The settings of a TOML file (not yet checked): its [run] table, or its top-level keys
    when it has none.
    Anything else (keys beside [run], other tables) is refused: it would be ignored."""
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError([f"config: file {str(path)!r} does not exist"]) from None
    except IsADirectoryError:
        raise ConfigError([f"config: {path} is a folder, not a TOML file"]) from None
    except UnicodeDecodeError:
        raise ConfigError([f"config: {path} is not a text file (not UTF-8)"]) from None
    except OSError as e:
        raise ConfigError([f"config: {path} cannot be read ({e.strerror})"]) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"config: {path} is not valid TOML ({e})"]) from None
    if "run" in data and not isinstance(data["run"], dict):
        raise ConfigError([f"config: {path}: 'run' must be a table ([run])"])
    settings = data["run"] if "run" in data else data
    problems = [f"config: {path}: table [{k}] is not read (settings go in [run])"
                for k, v in data.items() if k != "run" and isinstance(v, dict)]
    if "run" in data:
        problems += [f"config: {path}: key {k!r} is outside [run] (put every setting in [run])"
                     for k, v in data.items() if k != "run" and not isinstance(v, dict)]
    if problems:
        raise ConfigError(problems)
    return settings


#: Other tools' names for our knobs, offered as "did you mean".
ALIASES = {"learning_rate": "lr", "max_steps": "steps", "num_steps": "steps", "epsilon": "eps",
           "max_length": "seq_len", "seq_length": "seq_len", "dataset": "data",
           "lora_r": "lora_rank", "zo_eps": "eps", "batch": "batch_size"}


def unknown_setting(name: str) -> str:
    """'stpes: unknown setting; did you mean steps?' (the closest names, if any are close)."""
    known = [f.name for f in fields(RunConfig)]
    guess = name.strip().lower().replace("-", "_").replace(" ", "_")
    guess = ALIASES.get(guess, guess)
    close = [guess] if guess in known else difflib.get_close_matches(guess, known, n=3,
                                                                     cutoff=0.6)
    if close:
        return f"{name}: unknown setting; did you mean {' or '.join(close)}?"
    return (f"{name}: unknown setting (no setting has a similar name; the README's Settings "
            "table lists them)")


def parse_sets(items: list[str]) -> dict[str, str]:
    """``["lr=1e-6", "steps=5"]`` -> ``{"lr": "1e-6", "steps": "5"}``: the key is the text
    before the first ``=`` (spaces around it dropped: names have none), the value everything
    after it exactly as typed (``label_words= bad, great`` keeps its spaces, as TOML would);
    a key given twice keeps its last value."""
    out, problems = {}, []
    for item in items:
        if "=" not in item:
            problems.append(f"--set {item!r}: expected KEY=VALUE")
            continue
        k, v = item.split("=", 1)
        out[k.strip()] = v
    if problems:
        raise ConfigError(problems)
    return out


def resume_base(previous: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a resumed run starts from: the run's recorded config, less keys this version
    does not know and the ``ONE_START`` knobs (back to their defaults)."""
    known = {f.name for f in fields(RunConfig)}
    return {k: (default_of(RunConfig, k) if k in ONE_START else v) for k, v in previous.items()
            if k in known}


def check_resume(previous: Mapping[str, Any], cfg: RunConfig) -> list[str]:
    """Problems with continuing a run started with ``previous`` (a config dict) as ``cfg``:
    every knob outside ``RESUMABLE`` must stay as it was."""
    out = []
    for f in fields(RunConfig):
        old, new = previous.get(f.name, f.default), getattr(cfg, f.name)
        if f.name == "subgroup_size" and cfg.method != "fo-offload":
            continue  # read by fo-offload only (older runs stored its old default, 2 M)
        if f.name == "update_stride":  # an older run.json spells a stride as text
            old = read_stride(old)
        if f.name not in RESUMABLE and old != new:
            out.append(f"{f.name}: fixed for a resumed run (it was {old!r}, now {new!r}); "
                       f"a resume may change {', '.join(RESUMABLE[:5])}, ...")
    return out
