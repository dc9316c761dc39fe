"""Fixtures of the quality tests."""

from __future__ import annotations

import pytest

from tests.quality.helpers import ACCOUNTS_SUITE, TOPIC, Accounts, make_config, write_suite


@pytest.fixture
def accounts(tmp_path):
    """A config whose ``accounts`` table has a suite under policy quarantine, and a message source."""
    config = make_config(tmp_path, tables=[{"name": "accounts", "topic": TOPIC, "expectations": "accounts",
                                            "quality_policy": "quarantine"}])
    write_suite(config.expectations_dir, "accounts", ACCOUNTS_SUITE)
    return config, Accounts()
