"""t2sql's episode inside other RL frameworks: one thin module per framework, each an optional extra of its
name (docs/development.md, "Adding a framework adapter"), standing on the episode seam (t2sql.episode.rollout).
Here is what they share: `require`/`entry_point`, `module_help`, `on_episode_loop`, `episode_record`,
`settings_from_env`/`config_items` and `open_episode`. `import t2sql` imports none of them;
t2sql.integrations.rows imports no framework."""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import os
import sys
import threading
from contextlib import contextmanager
from dataclasses import asdict, fields, is_dataclass
from importlib import metadata
from types import ModuleType
from typing import Any, Awaitable, Callable, Iterator, Mapping, Sequence, TypeVar

from t2sql.chat_template import count_tokens
from t2sql.episode import rollout
from t2sql.episode.machine import Episode, EpisodeResult
from t2sql.episode.rollout import RolloutSettings, check_setting
from t2sql.errors import AdapterError, SettingsError, T2sqlError
from t2sql.integrations.rows import t2sql_row
from t2sql.progress import closed_stdout_exit

T = TypeVar("T")


class FrameworkMissing(T2sqlError, ImportError):
    """A framework an integration needs is not installed, or not a version it was checked against.
    Its message is one line that names the extra to install; under `python -m` of an integration
    (`entry_point`), only that line is printed."""


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


def config_items(config: Any) -> dict[str, Any] | None:
    """The t2sql settings a framework's own config holds, as settings_from_env's keyword overrides: none for
    None, the keys of a mapping (a dict, an OmegaConf DictConfig) or of a dataclass instance. None when the
    config is none of these: the adapter says where its framework keeps them."""
    if config is None:
        return {}
    if is_dataclass(config) and not isinstance(config, type):
        return asdict(config)
    if hasattr(config, "items"):
        return {str(k): v for k, v in config.items()}
    return None


def token_counter(tokenizer: Any) -> Callable[[str], int] | None:
    """How an episode counts a text's tokens with the framework's tokenizer (None: the episode counts words)."""
    return None if tokenizer is None else functools.partial(count_tokens, tokenizer)


async def open_episode(settings: RolloutSettings, row: Mapping[str, Any], *,
                       prompt: Sequence[Mapping[str, Any]] | None = None, tokenizer: Any = None) -> Episode:
    """The episode of a framework's dataset row (the t2sql row it carries, integrations.rows.t2sql_row) on
    this process's rollout context for `settings` (one Grader per process): its prompt `prompt` when the
    framework hands the row's messages over (else built from the task), its tokens counted with `tokenizer`.
    A framework that calls synchronously runs it through on_episode_loop."""
    ctx = rollout.context(settings)
    return await ctx.episode_async(ctx.task(t2sql_row(row)), prompt=prompt, count_tokens=token_counter(tokenizer))


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
        raise FrameworkMissing(f"{caller} needs {framework} {wanted} (not installed): {install}")
    if not _in_range(version, minimum, below):
        raise FrameworkMissing(f"{caller} needs {framework} {wanted} (found {version}): {install}")
    try:
        return importlib.import_module(import_name)
    except ImportError as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise FrameworkMissing(f"{caller} needs {framework} {wanted}; {distribution} {version} is installed but "
                               f"{import_name} does not import ({why}): {install}") from e


@contextmanager
def entry_point(module_name: str) -> Iterator[None]:
    """Around what an integration runs at import and under `python -m`: run as the program (`module_name`
    is "__main__"), a FrameworkMissing raised inside prints its one line and exits 1, not a traceback;
    imported, it goes on to the importer. Nothing process-wide is changed."""
    try:
        yield
    except FrameworkMissing as e:
        if module_name != "__main__":
            raise
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None


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


def _in_range(version: str, minimum: str, below: str | None) -> bool:
    """Whether `version` is >= minimum and < below, as PEP 440 orders them: a pre-release or dev build of
    the minimum comes before it (refused); one of a later release counts as that release. A version
    packaging cannot read is refused."""
    from packaging.specifiers import SpecifierSet  # lazily: only an integration's import asks
    from packaging.version import InvalidVersion

    wanted = SpecifierSet(f">={minimum}" + (f",<{below}" if below else ""))
    try:
        return wanted.contains(version, prereleases=True)
    except InvalidVersion:
        return False


def _calling_module() -> str:
    """The integration asking (its module's own name even when run with `python -m`)."""
    names = sys._getframe(2).f_globals
    spec = names.get("__spec__")
    return spec.name if spec is not None else names.get("__name__", "t2sql.integrations")


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
