"""The pin check itself: pins are keyed by the CPU kind and survive a release that changes no weight;
a kind without pins fails and names the recording command; recording adds only what the kind lacks,
under the kind's own versions, unless told to overwrite."""

import json

import pytest

from tests import weight_pins

RECORDED = {"torch": "1.0", "transformers": "1.0", "tokenizers": "1.0"}
RELEASED = {"torch": "1.0", "transformers": "1.1", "tokenizers": "1.0"}


@pytest.fixture
def pins_file(tmp_path, monkeypatch):
    path = tmp_path / "pins.json"
    path.write_text(json.dumps({"Known CPU": {"recorded_under": RECORDED, "pins": {"case/a": "abc"}}}))
    monkeypatch.setattr(weight_pins, "PINS_FILE", path)
    monkeypatch.setattr(weight_pins, "cpu_kind", lambda: "Known CPU")
    monkeypatch.setattr(weight_pins, "library_versions", lambda: dict(RECORDED))
    monkeypatch.delenv("BERTOLOGY_RECORD_PINS", raising=False)
    return path


def test_same_versions_pass_on_the_pinned_weights_and_fail_on_others(pins_file):
    weight_pins.check_pin("case/a", "abc")
    with pytest.raises(AssertionError, match="the weights changed"):
        weight_pins.check_pin("case/a", "abd")


def test_other_versions_with_the_same_weights_pass(pins_file, monkeypatch):
    monkeypatch.setattr(weight_pins, "library_versions", lambda: dict(RELEASED))
    weight_pins.check_pin("case/a", "abc")


def test_other_versions_with_other_weights_fail_naming_both_version_sets(pins_file, monkeypatch):
    monkeypatch.setattr(weight_pins, "library_versions", lambda: dict(RELEASED))
    with pytest.raises(AssertionError) as err:
        weight_pins.check_pin("case/a", "abd")
    message = str(err.value)
    assert "transformers 1.0" in message and "transformers 1.1" in message
    assert "BERTOLOGY_RECORD_PINS=overwrite" in message and "-m pins" in message
    assert "requirements.lock" in message


def test_a_kind_without_pins_fails_and_says_how_to_record_them(pins_file, monkeypatch):
    monkeypatch.setattr(weight_pins, "cpu_kind", lambda: "Other CPU")
    with pytest.raises(AssertionError) as err:
        weight_pins.check_pin("case/a", "abc")
    message = str(err.value)
    assert "Other CPU" in message and "BERTOLOGY_RECORD_PINS=1" in message and "-m pins" in message


def test_recording_adds_missing_cases_and_overwrites_only_when_told(pins_file, monkeypatch):
    monkeypatch.setenv("BERTOLOGY_RECORD_PINS", "1")
    weight_pins.check_pin("case/a", "changed")
    weight_pins.check_pin("case/b", "new")
    assert json.loads(pins_file.read_text())["Known CPU"]["pins"] == {"case/a": "abc", "case/b": "new"}
    monkeypatch.setenv("BERTOLOGY_RECORD_PINS", "overwrite")
    monkeypatch.setattr(weight_pins, "library_versions", lambda: dict(RELEASED))
    weight_pins.check_pin("case/a", "changed")
    kind = json.loads(pins_file.read_text())["Known CPU"]
    assert kind["pins"]["case/a"] == "changed" and kind["recorded_under"] == RELEASED


def test_recording_a_new_case_under_other_versions_is_refused(pins_file, monkeypatch):
    """A kind's pins come from one set of versions; a case added under another would be a mixed record."""
    monkeypatch.setenv("BERTOLOGY_RECORD_PINS", "1")
    monkeypatch.setattr(weight_pins, "library_versions", lambda: dict(RELEASED))
    with pytest.raises(AssertionError, match="recorded under"):
        weight_pins.check_pin("case/b", "new")
    assert "case/b" not in json.loads(pins_file.read_text())["Known CPU"]["pins"]


def test_a_new_kind_is_recorded_with_its_versions(pins_file, monkeypatch):
    monkeypatch.setattr(weight_pins, "cpu_kind", lambda: "Other CPU")
    monkeypatch.setenv("BERTOLOGY_RECORD_PINS", "1")
    weight_pins.check_pin("case/a", "xyz")
    assert json.loads(pins_file.read_text())["Other CPU"] == {"recorded_under": RECORDED, "pins": {"case/a": "xyz"}}


def test_every_pinned_kind_has_the_same_cases_and_records_its_versions():
    """A kind recorded with fewer cases than another would pass the missing ones nowhere."""
    pins = json.loads(weight_pins.PINS_FILE.read_text())
    cases = {kind: set(entry["pins"]) for kind, entry in pins.items()}
    first = next(iter(cases.values()))
    assert all(c == first for c in cases.values()), {k: len(v) for k, v in cases.items()}
    assert all({"torch", "transformers"} <= set(entry["recorded_under"]) for entry in pins.values())
