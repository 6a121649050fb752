"""The equivalence check: whether a prediction the grade calls correct agrees with the gold on every
database of the gold's kind, refuted with a witness when it does not (docs/episode.md)."""
