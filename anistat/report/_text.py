"""A tiny rich-text model rendered to both targets: plain strings (escaped on render) and
:class:`Math` segments (trusted markup the report itself writes, given in both languages)."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

from markupsafe import Markup

from .escape import esc, tex

# ---------------------------------------------------------------- rich text


@dataclass(frozen=True)
class Math:
    """A formula or other trusted markup, given in both target languages."""

    html: str
    latex: str


Segment = str | Math


@dataclass(frozen=True)
class Para:
    """A paragraph: plain-text strings (escaped on render) and Math segments."""

    segments: tuple[Segment, ...]
    heading: str | None = None

    def to_html(self) -> Markup:
        """The paragraph's body as HTML (the heading is the template's)."""
        return Markup("".join(esc(s) if isinstance(s, str) else s.html for s in self.segments))

    def plain(self) -> str:
        """Plain text (formulas without their markup): what a reader sees, for tests and logs."""
        parts = [s if isinstance(s, str) else html.unescape(re.sub(r"<[^>]+>", "", s.html)) for s in self.segments]
        return (f"{self.heading}. " if self.heading else "") + "".join(parts)

    def to_latex(self) -> str:
        body = "".join(tex(s) if isinstance(s, str) else s.latex for s in self.segments)
        head = r"\paragraph{" + tex(self.heading) + ".} " if self.heading else ""
        return head + body


def P(*segments: Segment, heading: str | None = None) -> Para:
    return Para(tuple(segments), heading)


def M(html_markup: str, latex_markup: str) -> Math:
    return Math(html_markup, latex_markup)
