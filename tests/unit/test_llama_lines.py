"""SpokenLine (bridge/engines/llama/_lines.py): how a streamed line of dialogue ends. Pure
text logic, no model: each test feeds pieces as the generation thread would."""

from __future__ import annotations

from bridge.engines.llama._lines import SpokenLine, loops


def play(pieces: list[str], soft: int = 1000, cut: bool = False) -> tuple[list[str], str, bool]:
    """Feeds ``pieces`` (one token each) until the line stops; returns what was shown piece
    by piece, the whole line, and whether it stopped early."""
    line = SpokenLine(soft_tokens=soft)
    shown = []
    for n, piece in enumerate(pieces, 1):
        shown.append(line.feed(piece, n))
        if line.stopped:
            break
    shown.append(line.end(cut=cut and not line.stopped))
    return shown, "".join(shown), line.stopped


def test_the_first_sentence_streams_piece_by_piece() -> None:
    shown, text, _ = play(["Welcome", " to", " the", " Flagon", "."])
    assert shown[:4] == ["Welcome", " to", " the", " Flagon"]
    assert text == "Welcome to the Flagon."


def test_leading_white_space_is_not_spoken() -> None:
    _, text, _ = play(["\n", " Aye", "."])
    assert text == "Aye."


def test_later_sentences_are_released_whole_when_they_end() -> None:
    shown, text, _ = play(["Aye", ".", " Three", " barrels", " left", ".", " Sit", " down", "."])
    assert shown[:2] == ["Aye", ""]  # the full stop waits for what follows it
    assert " Three barrels left." in shown  # one piece, released at its end
    assert text == "Aye. Three barrels left. Sit down."


def test_a_repeated_sentence_ends_the_line_before_it_is_spoken() -> None:
    _, text, stopped = play(["I'm", " sorry", ".", " I'm", " sorry", ".", " I'm", " sorry", "."])
    assert text == "I'm sorry."
    assert stopped


def test_a_sentence_that_makes_the_line_loop_is_dropped() -> None:
    words = "The brave and the brave and the brave and the brave.".split(" ")
    pieces = ["Welcome", ".", " "] + [w + " " for w in words[:-1]] + [words[-1], " More", "."]
    _, text, stopped = play(pieces)
    assert text == "Welcome."
    assert stopped


def test_past_the_soft_limit_the_line_ends_at_the_next_sentence_end() -> None:
    pieces = ["One", ".", " Two", " words", ".", " Three", " more", " words", ".", " Four", "."]
    _, text, stopped = play(pieces, soft=4)
    assert text == "One. Two words."
    assert stopped


def test_an_unfinished_sentence_is_dropped_at_the_hard_limit() -> None:
    _, text, _ = play(["It", " is", " late", ".", " The", " road", " north"], cut=True)
    assert text == "It is late."


def test_a_first_sentence_cut_by_the_hard_limit_stays_as_it_streamed() -> None:
    _, text, _ = play(["It", " is", " late", " and"], cut=True)
    assert text == "It is late and"


def test_the_model_ending_the_line_keeps_its_last_sentence_without_trailing_space() -> None:
    _, text, _ = play(["Aye", ".", " Three", " left", ".", "  \n"])
    assert text == "Aye. Three left."


def test_a_tool_call_batch_passes_through_untouched() -> None:
    pieces = ['{"', "tool_calls", '":[', "]}"]
    _, text, stopped = play(pieces, soft=1)
    assert text == '{"tool_calls":[]}'
    assert not stopped


def test_loops_counts_a_four_gram_three_times() -> None:
    assert loops("a b c d a b c d a b c d".split())
    assert not loops("a b c d a b c d".split())


def test_a_line_break_ends_the_line() -> None:
    _, text, stopped = play(["Aye", ".", " Sit", " down", "\n", "1", ".", " Ale"])
    assert text == "Aye. Sit down"
    assert stopped


def test_a_line_break_inside_the_first_sentence_ends_the_line_there() -> None:
    _, text, stopped = play(["(", "smiles", ")", "\n", "Welcome", "."])
    assert text == "(smiles)"
    assert stopped


def test_a_sentence_that_nearly_repeats_an_earlier_one_ends_the_line() -> None:
    pieces = [
        "Greta",
        ",",
        " keeper",
        " of",
        " the",
        " Flagon",
        ".",
        " I'm",
        " Greta",
        ",",
        " keeper",
        " of",
        " the",
        " Flagon",
        ".",
        " Sit",
        ".",
    ]
    _, text, stopped = play(pieces)
    assert text == "Greta, keeper of the Flagon."
    assert stopped


def test_short_sentences_with_common_words_are_not_taken_for_repeats() -> None:
    _, text, _ = play(["Aye", ".", " Aye", " then", ".", " Sit", " down", "."])
    assert text == "Aye. Aye then. Sit down."


def play_unlabel(pieces: list[str]) -> tuple[list[str], str]:
    line = SpokenLine(soft_tokens=1000, unlabel=True)
    shown = [line.feed(piece, n) for n, piece in enumerate(pieces, 1)]
    shown.append(line.end(cut=False))
    return shown, "".join(shown)


def test_a_speaker_label_the_model_copies_is_dropped_with_its_quote_marks() -> None:
    # the prompt renders other NPCs' lines as "Name: line"; a small model answers in kind
    assert play_unlabel(["Bram", ":", " The", " storm", " is", " here", "."])[1] == "The storm is here."
    assert play_unlabel(["Old", " Tom", ":", ' "', "Aye", ",", " lad", '."'])[1] == "Aye, lad."
    assert play_unlabel(["Greta", ":", " Bram", ":", " Hm", "."])[1] == "Hm.", "label after label"


def test_without_a_label_the_first_words_are_held_only_while_they_could_be_one() -> None:
    shown, text = play_unlabel(["Greta", ",", " the", " storm", "."])
    assert shown[:3] == ["", "Greta,", " the"], "released at the comma: not a label"
    assert text == "Greta, the storm."
    shown, text = play_unlabel(["the", " storm", "."])
    assert shown[0] == "the", "a lower-case start cannot be a label: streams at once"
    assert play_unlabel(["Aye", "."])[1] == "Aye.", "a one-word line that looked like a label's start"
    assert play_unlabel(["Note", ":", " nothing"])[1] == "nothing", "a label-shaped start is a label"


def test_lines_are_not_unlabelled_without_other_speakers() -> None:
    line = SpokenLine(soft_tokens=1000)
    assert line.feed("Bram", 1) == "Bram", "player turns stream from the first token"
    assert line.feed(":", 2) == ":"
