"""One error type for bad input: the CLI prints its message as a single line."""
import numbers


class KernelsightError(ValueError):
    """Bad input (config, catalog entry, shape, file, row): message says what and where."""


def closest(word: str, choices, most: int = 4, canonical=None) -> list[str]:
    """The choices a mistyped word most likely meant: those it is the start of ('h100' -> h100_pcie,
    h100_sxm; none when more than `most` are: too short to guess), else the nearest spelling; [] when
    nothing is close. Case-insensitive. canonical: choice -> the name to report (aliases count once)."""
    import difflib

    name = {str(c).lower(): str(canonical[c] if canonical else c) for c in choices}
    word = str(word).lower()
    starts = sorted({name[c] for c in name if c.startswith(word) and c != word}) if word else []
    if starts:
        return starts if len(starts) <= most else []
    return [name[c] for c in difflib.get_close_matches(word, list(name), n=1, cutoff=0.5)]


def either(names) -> str:
    """'a', 'a' or 'b', 'a', 'b' or 'c': quoted names for a message."""
    quoted = [repr(str(n)) for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def did_you_mean(word: str, choices) -> str:
    """A ' (did you mean X?)' suffix naming the closest choices, or '' if none is close."""
    close = closest(word, choices)
    return f" (did you mean {either(close)}?)" if close else ""


def whole_number(value, setting: str, minimum: int = 1, hint: str = "") -> int:
    """A setting that must be an integer >= minimum, or one line naming it. A bool is not an integer here
    (YAML `true` would count as 1), nor is a float or a string; numpy integers are."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise KernelsightError(f"{setting}={value!r}: must be an integer >= {minimum}{f' ({hint})' if hint else ''}")
    return int(value)


def check_seed(value, setting: str = "seed") -> int:
    """A random seed: an integer >= 0, or one line naming the setting (numpy's generators refuse a
    negative seed with a traceback and turn a float or a bool into some other seed)."""
    return whole_number(value, setting, minimum=0, hint="a random seed")
