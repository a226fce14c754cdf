"""``models.yaml`` read within bounds (``exporters.schema.bounded_yaml``), without a build: what the
YAML loader expands is measured right after loading, every alias counted as often as it is used, and a
spec that would expand past the limit, refer to itself, nest past the parser or hold a number too long
to convert is refused in one ``SpecError`` naming the field or the file. The fault matrix runs the same
specs through ``python -m exporters validate`` (tests/faults/test_build_and_spec.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporters.errors import SpecError
from exporters.schema.bounded_yaml import MAX_SPEC_BYTES, check_expansion, load_spec_document

SPEC = Path(__file__).resolve().parents[4] / "models.yaml"


def laughs(levels: int) -> str:
    """A model's options with ten aliases of the level below at each level: 10**levels strings from a
    few hundred bytes."""
    lines = ["models:", "  - name: m", "    source: trivial", "    options:", '      a0: &a0 "lol"']
    lines += [f"      a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 10)}]" for n in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path


def test_the_shipped_spec_reads_within_bounds() -> None:
    assert [m["name"] for m in load_spec_document(SPEC)["models"]][:1] == ["recommender"]


def test_aliases_that_expand_past_the_limit_are_refused_naming_where(tmp_path: Path) -> None:
    with pytest.raises(
        SpecError, match=r"expands to [\d,]+ values and characters, more than a spec"
    ) as caught:
        load_spec_document(written(tmp_path, laughs(7)))
    found = re.match(r"models\[0\]\.options\.a7: expands to ([\d,]+) ", str(caught.value))
    assert found and int(found[1].replace(",", "")) > 4 * 10**7  # 10**7 strings of "lol", each 1 + 3


def test_aliases_within_the_limit_are_a_spec_like_any_other(tmp_path: Path) -> None:
    document = load_spec_document(written(tmp_path, laughs(3)))  # 1,000 strings: a long list, no more
    assert len(document["models"][0]["options"]["a3"]) == 10


def test_the_expansion_counts_every_use_of_an_alias() -> None:
    shared = ["x" * 10] * 10  # one list, used 100 times: 100 × (1 + 10 × 11) counted, not 111
    check_expansion({"a": [shared] * 100}, limit=11_200)
    with pytest.raises(SpecError, match=r"^a: expands to 11,\d{3} values"):
        check_expansion({"a": [shared] * 100}, limit=11_000)


def test_a_spec_that_refers_to_itself_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"refers to itself \(a recursive YAML alias\); a spec is a tree"):
        load_spec_document(written(tmp_path, "models: &m [*m]\n"))


def test_nesting_deeper_than_the_parser_follows_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="is nested deeper than the YAML parser can follow"):
        load_spec_document(written(tmp_path, "models: " + "[" * 100_000 + "]" * 100_000 + "\n"))


def test_a_number_too_long_to_convert_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="holds a value YAML cannot convert"):
        load_spec_document(written(tmp_path, f"seed: {'9' * 5000}\n"))


def test_a_file_larger_than_a_spec_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = written(tmp_path, "# " + "x" * MAX_SPEC_BYTES + "\n")
    with pytest.raises(SpecError, match=re.escape(f"{path}: is larger than 1 MiB; a spec is a few KiB")):
        load_spec_document(path)


@pytest.mark.parametrize(
    ("text", "said"), [(None, "cannot read spec: [Errno 2]"), ("a: [1\n", "cannot read spec:")]
)
def test_a_file_that_is_missing_or_not_yaml_is_one_line_naming_it(
    text: str | None, said: str, tmp_path: Path
) -> None:
    path = tmp_path / "models.yaml" if text is None else written(tmp_path, text)
    with pytest.raises(SpecError) as caught:
        load_spec_document(path)
    assert str(caught.value).startswith(f"{path}: {said}")
