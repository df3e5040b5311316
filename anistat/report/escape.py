"""The one escaping function per output target: :func:`esc` (HTML) and :func:`tex` (LaTeX).

Every user-provided string that reaches an HTML or LaTeX file of anistat — report, tables,
replication comparison — goes through one of these. (The jinja2 templates autoescape with the
same rules as :func:`esc`.)
"""

from __future__ import annotations

import html
import re

# ---------------------------------------------------------------- HTML


def esc(value: object) -> str:
    """HTML-escape any value (quotes included, so it is safe in attributes too)."""
    return html.escape("" if value is None else str(value), quote=True)


# ---------------------------------------------------------------- LaTeX

_TEX_ASCII = {
    "\\": r"\textbackslash{}",
    "{": r"\{",
    "}": r"\}",
    "$": r"\$",
    "&": r"\&",
    "%": r"\%",
    "#": r"\#",
    "_": r"\_",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
    '"': r"\textquotedbl{}",
    "\n": " ",
    "\r": " ",
    "\t": " ",
}
_TEX_UNICODE = {
    "\u2013": "--",
    "\u2014": "---",
    "\u2018": "`",
    "\u2019": "'",
    "\u201c": "``",
    "\u201d": "''",
    "\u2026": r"\ldots{}",
    "\u00a0": "~",
    "\u00b7": r"\textperiodcentered{}",
    "\u00d7": r"$\times$",
    "\u00b1": r"$\pm$",
    "\u2212": "$-$",
    "\u2264": r"$\leq$",
    "\u2265": r"$\geq$",
    "\u2248": r"$\approx$",
    "\u2260": r"$\neq$",
    "\u2192": r"$\to$",
    "\u2191": r"$\uparrow$",
    "\u2193": r"$\downarrow$",
    "\u2208": r"$\in$",
    "\u2016": r"$\|$",
    "\u221a": r"$\surd$",
    "\u221e": r"$\infty$",
    "\u2211": r"$\sum$",
    "\u0394": r"$\Delta$",
    "\u03a3": r"$\Sigma$",
    "\u03b1": r"$\alpha$",
    "\u03b2": r"$\beta$",
    "\u03b6": r"$\zeta$",
    "\u03c1": r"$\rho$",
    "\u03c3": r"$\sigma$",
    "\u03bc": r"$\mu$",
    "\u00b5": r"$\mu$",
    "\u03bb": r"$\lambda$",
    "\u2082": r"$_2$",
    "\u2096": r"$_k$",
    "\u1d40": r"$^{\top}$",
    "\u2217": "*",
    "\u2022": r"\textbullet{}",
    "\u00ab": r"\guillemotleft{}",
    "\u00bb": r"\guillemotright{}",
    # GPT-2 byte-level BPE markers for a leading space and a newline.
    "\u0120": r"\textvisiblespace{}",
    "\u010a": r"\textbackslash{}n",
}


def tex(value: object) -> str:
    """Escape a string for LaTeX text mode (pdflatex, T1 + utf8).

    ASCII specials are escaped; Latin-1 letters pass through (T1 covers them); a few common
    symbols map to LaTeX; anything else becomes ``[U+hex code]`` so pdflatex never fails on it.
    """
    s = "" if value is None else str(value)
    out: list[str] = []
    for ch in s:
        code = ord(ch)
        if ch in _TEX_ASCII:
            out.append(_TEX_ASCII[ch])
        elif ch in _TEX_UNICODE:
            out.append(_TEX_UNICODE[ch])
        elif code < 32 or code == 127:
            out.append(" ")
        elif code < 127:
            out.append(ch)
        elif 0xC0 <= code <= 0xFF and code not in (0xD7, 0xF7):
            out.append(ch)
        else:
            out.append(r"\texttt{[U+%04X]}" % code)
    return "".join(out)


def tex_num(text: str) -> str:
    """Wrap an already formatted number in \\num{} (siunitx); pass-through for empty/inf."""
    if text == "" or not re.fullmatch(r"-?\d+(\.\d+)?(e[-+]?\d+)?", text):
        return tex(text) if text else "--"
    return r"\num{" + text + "}"
