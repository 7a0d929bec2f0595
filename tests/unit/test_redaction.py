"""Any stretch of a configured secret, 8 characters or more, hidden wherever it appears in a text."""

from __future__ import annotations

import secrets

from telemetry_jit import redaction
from telemetry_jit.exporters.otlp_settings import OTLPOptions, OTLPSettings


def test_every_stretch_of_a_secret_is_hidden_whatever_surrounds_it() -> None:
    token = "sk-" + secrets.token_hex(16)
    redaction.register([f"Bearer {token}"])
    for text in (
        f"invalid credentials: {token}",  # echoed without the header's "Bearer "
        f"key {token[:16]}... refused",  # a prefix
        f"({token[5:20]})",  # the middle
        f"x{token}{token[-9:]}y",  # run together
    ):
        scrubbed = redaction.scrub(text)
        assert all(token[i : i + 8] not in scrubbed for i in range(len(token) - 7)), scrubbed
        assert "***" in scrubbed
    assert (
        redaction.scrub(f"{token[:7]} is too short to be worth guessing")
        == f"{token[:7]} is too short to be worth guessing"
    )
    # the characters around it kept ("!" is no hex digit: a "b" after it extends the run when the token's ninth is one)
    assert redaction.scrub(f"one run: a{token[:8]}!") == "one run: a***!"


def test_a_short_secret_is_hidden_only_in_its_settings_texts() -> None:
    settings = OTLPSettings.resolve(OTLPOptions(endpoint="http://127.0.0.1:4317?tenant=jit", headers={"x-key": "on1"}))
    assert settings.scrub("refused tenant=jit with on1") == "refused *** with ***"
    assert redaction.scrub("telemetry-jit: on1") == "telemetry-jit: on1"  # not in every warning


def test_settings_hide_a_header_variable_they_do_not_use(monkeypatch) -> None:
    token = secrets.token_hex(12)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization=Bearer%20{token}")
    settings = OTLPSettings.resolve(
        OTLPOptions(endpoint="http://127.0.0.1:4317", headers={"authorization": "other-1234567"})
    )
    said = f"UNAUTHENTICATED: invalid credentials: {token[:10]}"
    assert token[:8] not in settings.scrub(said) and token[:8] not in redaction.scrub(said)
