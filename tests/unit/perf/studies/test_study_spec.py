"""``make perf SPEC=… MODELS=…``: models of any spec become study families, without a server."""

from __future__ import annotations

from pathlib import Path

import pytest

from perf.cli import parser, profile_from
from perf.errors import OptionError
from perf.studies.study_spec import MODES, study_spec

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "own_model" / "models.yaml"


def test_a_model_of_the_spec_is_a_family_served_in_every_mode() -> None:
    args = parser().parse_args(
        ["run", "--profile", "smoke", "--spec", str(EXAMPLE), "--models", "vision_python"]
    )
    profile = profile_from(args)
    assert profile.families == ("vision_python",) and set(profile.spec_families) == {"vision_python"}
    assert profile.text_modes == () and profile.queue_policy_s == 0  # the zoo's own studies: not for it
    graph = profile.spec_families["vision_python"]
    assert graph["source"] == {"python": "own_model.vision:build", "path": str(EXAMPLE.parent)}
    assert graph["outputs"][0]["tolerance"] == {"kind": "class_scores"}
    spec = study_spec(list(profile.families), list(profile.modes), profile.seed, profile.family_table)
    served = {m.name: m for m in spec.models}
    for mode in profile.modes:
        model = served[f"vision_python_{mode}"]
        assert model.source == spec.models[0].source and model.batching.mode == MODES[mode].batching["mode"]
        assert model.max_batch_size == 32 and model.instances.cpu == MODES[mode].instances


def test_zoo_families_keep_their_meaning_and_unknown_names_are_usage_errors() -> None:
    zoo = profile_from(parser().parse_args(["run", "--profile", "smoke", "--models", "recommender"]))
    assert zoo.spec_families == {} and zoo.families == ("recommender",)
    mixed = parser().parse_args(["run", "--spec", str(EXAMPLE), "--models", "recommender,vision_python"])
    assert profile_from(mixed).text_modes  # a zoo family asked for: the zoo's studies run as before
    with pytest.raises(OptionError, match=r"unknown models \(--models\): nope; neither zoo families .* nor"):
        profile_from(parser().parse_args(["run", "--spec", str(EXAMPLE), "--models", "nope"]))
