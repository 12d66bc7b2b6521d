"""Generated secrets (admin tokens, key secrets of a local fleet) work on a command line."""

from __future__ import annotations

import argparse
import base64

from gateway.tenancy import new_secret


def test_no_secret_starts_with_a_dash_and_each_carries_its_bytes() -> None:
    tokens = [new_secret(24) for _ in range(3_000)]  # token_urlsafe: ~47 would start with "-"
    assert not [t for t in tokens if t.startswith("-")]
    assert len(set(tokens)) == len(tokens)
    assert all(len(base64.urlsafe_b64decode(t + "=" * (-len(t) % 4))) == 24 for t in tokens)


def test_a_secret_follows_an_option_on_a_command_line() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--admin-token")
    for _ in range(500):
        token = new_secret(24)
        assert parser.parse_args(["--admin-token", token]).admin_token == token
