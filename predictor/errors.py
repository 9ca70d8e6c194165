"""One error type for bad input: the CLI prints its message as a single line."""


class KernelsightError(ValueError):
    """Bad input (config, catalog entry, shape, file, row): message says what and where."""


def did_you_mean(word: str, choices) -> str:
    """A ' (did you mean X?)' suffix for the closest choice, or '' if none is close."""
    import difflib

    close = difflib.get_close_matches(str(word).lower(), [str(c).lower() for c in choices], n=1, cutoff=0.5)
    if not close:
        return ""
    original = {str(c).lower(): str(c) for c in choices}[close[0]]
    return f" (did you mean {original!r}?)"
