"""The pin check itself: a CPU kind without pins fails and names the recording command; recording
adds only what the kind lacks unless told to overwrite."""

import json

import pytest

from tests import weight_pins


@pytest.fixture
def pins_file(tmp_path, monkeypatch):
    path = tmp_path / "pins.json"
    path.write_text(json.dumps({"Known CPU | torch 1 | transformers 1": {"case/a": "abc"}}))
    monkeypatch.setattr(weight_pins, "PINS_FILE", path)
    monkeypatch.delenv("BERTOLOGY_RECORD_PINS", raising=False)
    return path


def test_a_kind_without_pins_fails_and_says_how_to_record_them(pins_file, monkeypatch):
    monkeypatch.setattr(weight_pins, "machine_key", lambda: "Other CPU | torch 1 | transformers 1")
    with pytest.raises(AssertionError) as err:
        weight_pins.check_pin("case/a", "abc")
    message = str(err.value)
    assert "Other CPU" in message and "BERTOLOGY_RECORD_PINS=1" in message and "-m pins" in message


def test_a_pinned_kind_passes_on_its_value_and_fails_on_another(pins_file, monkeypatch):
    monkeypatch.setattr(weight_pins, "machine_key", lambda: "Known CPU | torch 1 | transformers 1")
    weight_pins.check_pin("case/a", "abc")
    with pytest.raises(AssertionError, match="the weights changed"):
        weight_pins.check_pin("case/a", "abd")


def test_recording_adds_missing_cases_and_overwrites_only_when_told(pins_file, monkeypatch):
    key = "Known CPU | torch 1 | transformers 1"
    monkeypatch.setattr(weight_pins, "machine_key", lambda: key)
    monkeypatch.setenv("BERTOLOGY_RECORD_PINS", "1")
    weight_pins.check_pin("case/a", "changed")
    weight_pins.check_pin("case/b", "new")
    assert json.loads(pins_file.read_text())[key] == {"case/a": "abc", "case/b": "new"}
    monkeypatch.setenv("BERTOLOGY_RECORD_PINS", "overwrite")
    weight_pins.check_pin("case/a", "changed")
    assert json.loads(pins_file.read_text())[key]["case/a"] == "changed"


def test_every_pinned_kind_has_the_same_cases():
    """A kind recorded with fewer cases than another would pass the missing ones nowhere."""
    pins = json.loads(weight_pins.PINS_FILE.read_text())
    cases = {kind: set(values) for kind, values in pins.items()}
    first = next(iter(cases.values()))
    assert all(c == first for c in cases.values()), {k: len(v) for k, v in cases.items()}
