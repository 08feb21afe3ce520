"""Text the gate does not control (prompt ids, policy keys and paths, URLs, server error text,
``/model_info`` values) made safe to show: on a terminal, in Markdown, in HTML.

Three dangers, whatever the medium: markup (``[/x]`` is Rich markup, ``<b>`` HTML, ``|`` or a
leading ``#`` Markdown), line breaks that start a line of the gate's own format (``\\nverdict:
PASS``), and invisible controls that reorder what is shown (a right-to-left override). Control
and format characters (Unicode categories Cc, Cf, Zl, Zp: the bidi controls among them) are
written as ``\\uXXXX``; each medium then escapes its own markup.
"""

from __future__ import annotations

import html
import re
import unicodedata

from rich.markup import escape as rich_escape

_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp"})


def printable(text: object, keep_newlines: bool = False) -> str:
    """``text`` with every control, format and separator character as ``\\uXXXX`` (newlines and
    tabs kept when ``keep_newlines``: where they cannot start a line of their own, as in HTML)."""
    out = []
    for ch in str(text):
        if keep_newlines and ch in "\n\t":
            out.append(ch)
        elif unicodedata.category(ch) in _INVISIBLE:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def for_terminal(text: object, keep_newlines: bool = False) -> str:
    """``text`` on one line (``keep_newlines``: an error message of several lines of the gate's
    own), Rich markup escaped: for ``Console.print`` with markup on."""
    return rich_escape(printable(text, keep_newlines))


# Characters with a meaning in CommonMark/GFM inline text (the text never starts a line: line
# breaks are escaped, and the report's own prefix comes first; ``<`` and ``&`` are HTML-escaped).
_MARKDOWN = re.compile(r"([\\`*_{}\[\]|~])")


def for_markdown(text: object) -> str:
    """``text`` on one line, as literal Markdown text (HTML-escaped, punctuation escaped)."""
    return _MARKDOWN.sub(r"\\\1", html.escape(printable(text), quote=False))


def for_html(value: object) -> object:
    """Jinja's ``finalize``: strings shown without invisible controls (autoescape does the
    markup); anything else as it is."""
    return printable(value, keep_newlines=True) if isinstance(value, str) else value
