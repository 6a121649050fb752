"""The test suite's own BIRD data (tests/data/bird) is the real release, whole, with its notice."""

from __future__ import annotations

import hashlib
import json

from conftest import BIRD_ROOT, SAMPLE_ROOT


def test_the_bundled_bird_copy_matches_its_manifest():
    listed = {}
    for line in (BIRD_ROOT / "MANIFEST.sha256").read_text().splitlines():
        digest, name = line.split()
        listed[name.removeprefix("./")] = digest
    assert len(listed) == 5
    for name, digest in listed.items():
        assert hashlib.sha256((BIRD_ROOT / name).read_bytes()).hexdigest() == digest, name
    questions = json.loads((BIRD_ROOT / "dev.json").read_text())
    assert len(questions) == 432
    assert {q["db_id"] for q in questions} == {"superhero", "student_club", "toxicology"}
    assert "CC BY-SA 4.0" in (BIRD_ROOT / "NOTICE.md").read_text()


def test_the_package_sample_is_the_same_superhero():
    # The sample eval runs by default and the tests' copy are one database and one question set.
    assert (SAMPLE_ROOT / "superhero" / "superhero.sqlite").read_bytes() == \
        (BIRD_ROOT / "superhero" / "superhero.sqlite").read_bytes()
    sample = json.loads((SAMPLE_ROOT / "dev.json").read_text())
    full = json.loads((BIRD_ROOT / "dev.json").read_text())
    assert sample == [q for q in full if q["db_id"] == "superhero"]
