"""The gate's strength is part of its contract: a faster gate must not run fewer examples.

These numbers are the examples per property each hypothesis profile runs (conftest.py), and no property
test may lower them: the gate gets faster by scheduling and thread counts, never by fewer examples.
"""

from __future__ import annotations

import inspect

from hypothesis import settings

from tests import test_properties, test_rope_utils

EXAMPLES = {"ci": 50, "dev": 100, "nightly": 10_000, "gpu": 20}


def test_profiles_keep_their_example_counts():
    for profile, examples in EXAMPLES.items():
        assert settings.get_profile(profile).max_examples == examples, profile


def property_tests():
    for module in (test_properties, test_rope_utils):
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("test_") and getattr(fn, "is_hypothesis_test", False):
                yield f"{module.__name__}.{name}", fn


def test_no_property_runs_fewer_examples_than_its_profile():
    found = dict(property_tests())
    assert len(found) >= 13, sorted(found)  # the property module's 13 and test_random_shapes
    for name, fn in found.items():
        own = fn._hypothesis_internal_use_settings  # hypothesis attaches the settings a test runs with
        assert own.max_examples >= settings.default.max_examples, name
