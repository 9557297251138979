import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlplan.planner.quoting import UnclosedQuote, unquoted

PLAIN = st.text(alphabet=st.characters(blacklist_characters="'\"\\", codec="utf-8"), max_size=40)


def chars(text: str, *, hydra: bool) -> str:
    return "".join(char for _, char in unquoted(text, backslash_in_single_quotes=hydra))


@given(PLAIN)
def test_text_without_quotes_or_backslashes_is_all_unquoted(text):
    for hydra in (False, True):
        assert [i for i, _ in unquoted(text, backslash_in_single_quotes=hydra)] == list(range(len(text)))


@given(PLAIN, PLAIN, PLAIN, st.sampled_from("'\""))
def test_what_a_quote_holds_is_never_yielded(before, inside, after, quote):
    for hydra in (False, True):
        assert chars(f"{before}{quote}{inside}{quote}{after}", hydra=hydra) == before + after


def test_the_shell_has_no_escapes_in_single_quotes_and_hydra_does():
    # Shell: 'a\' ends at the second quote, so ",b" is outside. Hydra: \' is escaped, the quote stays open.
    assert chars(r"'a\',b", hydra=False) == ",b"
    with pytest.raises(UnclosedQuote):
        chars(r"'a\',b", hydra=True)


def test_an_escaped_character_outside_quotes_is_skipped_with_its_backslash():
    assert chars(r"a\,b\"c", hydra=False) == "abc"


def test_start_skips_the_prefix():
    assert list(unquoted("x(y)", 1, backslash_in_single_quotes=False)) == [(1, "("), (2, "y"), (3, ")")]
