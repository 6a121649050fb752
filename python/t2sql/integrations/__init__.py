"""t2sql's episode inside other RL frameworks: one thin module per framework, each an optional extra.

    t2sql.integrations.trl     TRL's GRPOTrainer (environment_factory, reward_funcs)   pip install ".[trl]"
    t2sql.integrations.verl    verl's agent loop, registered as "t2sql"                 pip install ".[verl]"
    t2sql.integrations.skyrl   SkyRL's text environment, registered as "t2sql"          pip install ".[skyrl]"

(t2sql is installed from its checkout: each command runs in the checkout's root.)

Each stands on the episode seam (t2sql.episode.rollout, the per-call episode API, the token trajectory)
and holds only the framework's side: none has a token loop, prompt, reward or grading rule of its own.
`import t2sql` imports none of them; t2sql.integrations.rows (the dataset rows `t2sql convert --format`
writes) imports no framework.

What they share is here:
- `require`: a framework's module, or one line naming the extra to install (FrameworkMissing).
- `module_help`: what `python -m` of an integration prints for `--help` when the integration is a
  library a training script imports (TRL, verl), not a command.
- `on_episode_loop`: the bridge for frameworks that call the environment synchronously (TRL, SkyRL): one
  event loop per process, on a daemon thread, runs every episode coroutine.
- `episode_record`: the episode record a framework keeps beside its sample.
- `settings_from_env`: the rollout settings (t2sql.episode.rollout.RolloutSettings) from T2SQL_*
  environment variables, for frameworks that build our class with no arguments or in a worker process;
  a bad value is a SettingsError (t2sql.errors) naming it.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import sys
import threading
from dataclasses import fields
from importlib import metadata
from types import ModuleType
from typing import Any, Awaitable, Mapping, Sequence, TypeVar

from t2sql.episode.machine import EpisodeResult
from t2sql.episode.rollout import RolloutSettings, check_setting
from t2sql.errors import AdapterError, SettingsError, T2sqlError
from t2sql.progress import closed_stdout_exit

T = TypeVar("T")


class FrameworkMissing(T2sqlError, ImportError):
    """A framework an integration needs is not installed, or not a version it was checked against.
    Its message is one line that names the extra to install; uncaught, it prints only that line."""


# The environment variables settings_from_env reads: variable -> (RolloutSettings field, type).
SETTINGS_ENV: dict[str, tuple[str, type]] = {
    "T2SQL_PRESET": ("preset", str),
    "T2SQL_DB_ROOT": ("db_root", str),
    "T2SQL_CACHE_DIR": ("cache_dir", str),
    "T2SQL_MANIFEST": ("manifest", str),
    "T2SQL_GRADER_CONCURRENCY": ("concurrency", int),
    "T2SQL_TOOL_TIMEOUT_S": ("tool_timeout_s", float),
    "T2SQL_GRADE_TIMEOUT_S": ("grade_timeout_s", float),
}
# The settings an integration takes by keyword (a framework's config): RolloutSettings' fields.
SETTING_NAMES = frozenset(f.name for f in fields(RolloutSettings))


def settings_from_env(environ: Mapping[str, str] | None = None, *, config: str = "",
                      **overrides: Any) -> RolloutSettings:
    """The rollout settings named by T2SQL_* environment variables (SETTINGS_ENV), keyword overrides
    winning (None leaves a field to the variable or the default). Each value is checked where it is read
    (t2sql.episode.rollout.check_setting): a bad one is a one-line SettingsError naming the variable, or
    the override as `config` + its name (`config`: where a framework's config keeps them, "t2sql.")."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for variable, (name, kind) in SETTINGS_ENV.items():
        raw = environ.get(variable, "").strip()
        if not raw:
            continue
        try:
            value = kind(raw)
        except ValueError:
            what = {int: "a whole number", float: "a number"}.get(kind, kind.__name__)
            raise SettingsError(f"{variable}={raw[:80]!r} is not {what}; unset it or give one") from None
        values[name] = check_setting(name, value, variable, raw)
    unknown = sorted(set(overrides) - SETTING_NAMES)
    if unknown:
        raise SettingsError(f"unknown t2sql setting(s) {', '.join(config + u for u in unknown)}; known: "
                            f"{', '.join(sorted(SETTING_NAMES))}")
    values.update({k: check_setting(k, v, config + k) for k, v in overrides.items() if v is not None})
    return RolloutSettings(**values)


def episode_record(result: EpisodeResult, preset_name: str) -> dict[str, Any]:
    """The episode record a framework keeps beside its sample: `t2sql eval`'s record of the episode
    (EpisodeResult.to_dict(), the grade included) and the preset's name."""
    return {**result.to_dict(), "preset": preset_name}


def require(import_name: str, *, framework: str, extra: str, minimum: str, below: str | None = None,
            distribution: str | None = None) -> ModuleType:
    """`import_name` imported, after checking that the installed `distribution` (default: the first part
    of import_name) is >= minimum and < below. Otherwise FrameworkMissing, one line naming the extra."""
    distribution = distribution or import_name.split(".")[0]
    wanted = f">= {minimum}" + (f", < {below}" if below else "")
    caller = _calling_module()
    install = install_command(extra)
    try:
        version = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        _fail(f"{caller} needs {framework} {wanted} (not installed): {install}")
    if _release(version) < _release(minimum) or (below is not None and _release(version) >= _release(below)):
        _fail(f"{caller} needs {framework} {wanted} (found {version}): {install}")
    try:
        return importlib.import_module(import_name)
    except ImportError as e:
        _fail(f"{caller} needs {framework} {wanted}; {distribution} {version} is installed but "
              f"{import_name} does not import ({str(e).splitlines()[0] if str(e) else type(e).__name__}): {install}")


def install_command(extra: str) -> str:
    """The command that installs an extra, as it works: from the root of t2sql's checkout (t2sql is not on
    PyPI; each framework's page in docs/ gives the same command)."""
    return f'in the t2sql checkout, pip install ".[{extra}]"'


def wants_help(argv: Sequence[str]) -> bool:
    """Whether `python -m` of an integration was asked for its help (or given nothing to do)."""
    return not argv or any(a in ("-h", "--help") for a in argv)


def print_help(first_line: str, doc: str | None) -> int:
    """An integration's --help: one line saying how it is used, then its module's documentation. The exit
    code: 0, or 141 when the reader went away (`--help | head`), never a traceback."""
    try:
        print(f"{first_line}\n\n{inspect.cleandoc(doc or '')}", flush=True)
    except BrokenPipeError:
        return closed_stdout_exit()
    return 0


def module_help(argv: Sequence[str], doc: str | None, name: str) -> int:
    """`python -m` of an integration a training script imports (`name`: trl, verl): with no argument or
    -h/--help, its documentation (the module's doc) and the page to read, exit 0; anything else is one line
    saying it is not a command, exit 2."""
    if wants_help(argv):
        return print_help(f"t2sql.integrations.{name}: imported by a training script, not a command "
                          f"(docs/{name}.md)", doc)
    print(f"error: t2sql.integrations.{name} is not a command (got {' '.join(argv)!r}); see --help or "
          f"docs/{name}.md", file=sys.stderr)
    return 2


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string ("1.16.0rc1" -> (1, 16, 0)): enough to compare the
    pins an integration states, without a dependency on `packaging`."""
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) < len(piece):
            break
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def _calling_module() -> str:
    """The integration asking (its module's own name even when run with `python -m`)."""
    names = sys._getframe(2).f_globals
    spec = names.get("__spec__")
    return spec.name if spec is not None else names.get("__name__", "t2sql.integrations")


def _fail(message: str) -> None:
    _install_one_line_hook()
    raise FrameworkMissing(message)


def _install_one_line_hook() -> None:
    """An uncaught FrameworkMissing prints its one line, not a traceback (other exceptions go on to the
    hook that was there). Installed only when one is raised."""
    previous = sys.excepthook
    if getattr(previous, "_t2sql_one_line", False):
        return

    def hook(kind, value, traceback):  # noqa: ANN001 - sys.excepthook's signature
        if isinstance(value, FrameworkMissing):
            print(f"error: {value}", file=sys.stderr)
            return
        previous(kind, value, traceback)

    hook._t2sql_one_line = True  # type: ignore[attr-defined]
    sys.excepthook = hook


class _EpisodeLoop:
    """One event loop on a daemon thread: every episode of this process runs there, so the process's
    Grader sees one loop (its admission and shared gold runs are per loop)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="t2sql-episodes", daemon=True)
        self.thread.start()


_episode_loop: _EpisodeLoop | None = None
_episode_loop_lock = threading.Lock()


def on_episode_loop(awaitable: Awaitable[T]) -> T:
    """Run a coroutine on the process's episode loop and wait for its result, from a framework's
    synchronous call on any thread but the loop's own. A process forked after the loop started (a loop
    does not survive fork) gets a loop of its own."""
    global _episode_loop
    with _episode_loop_lock:
        if _episode_loop is None or _episode_loop.pid != os.getpid():
            _episode_loop = _EpisodeLoop()
        current = _episode_loop
    if threading.current_thread() is current.thread:
        if asyncio.iscoroutine(awaitable):
            awaitable.close()  # never awaited: say so by the error below, not by a RuntimeWarning
        raise AdapterError("a t2sql environment was called from t2sql's own episode loop; call it from the "
                           "framework's side (or await the episode's coroutines directly)")
    return asyncio.run_coroutine_threadsafe(awaitable, current.loop).result()
