"""Every error t2sql raises, one family under T2sqlError (the core's own errors are in t2sql._grader)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from t2sql.data.tasks import Problem


class EvalError(Exception):
    """A usage or data problem that stops the run before it starts; the message says what to do."""


class LaunchError(RuntimeError):
    """The run cannot start; the message names what is missing and what to do."""


class SchemaError(ValueError):
    """The database's schema cannot be read (missing file, not SQLite, no tables)."""


class CurriculumError(ValueError):
    """The curriculum cannot run as configured; the message says what to change."""


class AdapterError(RuntimeError):
    """The adapter cannot run a sample (misconfiguration, or a malformed engine response)."""


class PresetError(ValueError):
    """An unknown preset name, an unknown field, or a value out of range."""


class DataError(ValueError):
    """The question file or databases cannot be converted; `problems` lists every reason."""

    def __init__(self, message: str, problems: list[Problem] | None = None):
        self.problems = list(problems or [])
        kinds = Counter(p.kind for p in self.problems)
        lines = [message]
        if len(kinds) > 1:
            lines.append("  by kind: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common()))
        # The rarer kinds first, so 2 odd rows are not buried under 2,000 missing databases.
        shown = sorted(self.problems, key=lambda p: (kinds[p.kind], p.row))
        lines += [f"  {p}" for p in shown[:50]]
        if len(self.problems) > 50:
            lines.append(f"  ... and {len(self.problems) - 50} more")
        super().__init__("\n".join(lines))
