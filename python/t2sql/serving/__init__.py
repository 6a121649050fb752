"""Serving SQL to many episodes at once: the `Grader`, its worker backends, the gold cache, the manifest."""
