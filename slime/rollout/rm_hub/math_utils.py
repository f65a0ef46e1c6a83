r"""Grading a final math answer by rule: the `math` and `deepscaler` rewards, and plugins' `grade_answer_verl`.

Two graders; a yes from either is a match:

- `grade_answer_mathd`: both answers rewritten the way MATH-benchmark answers are written (`\dfrac` is
  `\frac`, `\frac12` is `\frac{1}{2}`, `3/4` is `\frac{3}{4}`, `0.5` is `\frac{1}{2}`, "x = 3" is "3",
  degrees, `\left`/`\right`, `\$` and trailing `\text{ units}` dropped), then compared as strings.
- `grade_answer_sympy`: both turned into plain expressions (LaTeX to text, thousands commas, unit words,
  "or"/"and" lists, `million`), compared element by element for tuples and intervals, and where it is
  safe, by sympy: `simplify(truth - given) == 0`. An unreduced fraction is not equal to its reduced
  form, and an integer answer must be given as that integer (not as `\sqrt{4}`).

`extract_answer` takes the last `\boxed{...}` of a response. LaTeX is read by our own small converter
(`latex_to_text`), so no LaTeX library is needed; sympy (a dependency of torch) is imported on first use.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Any

# ------------------------------------------------------------------------------------------ boxed answers

_BOX_MACROS = ("\\boxed", "\\fbox")


def last_boxed_only_string(string: str) -> str | None:
    r"""The last `\boxed{...}` (or, when there is no `\boxed`, the last `\fbox{...}`) with its braces
    balanced, macro included; None when there is none or its braces never close."""
    for macro in _BOX_MACROS:
        start = string.rfind(macro)
        if start >= 0:
            break
    else:
        return None
    end = _group_end(string, start + len(macro))
    return None if end is None else string[start:end]


def _group_end(text: str, pos: int) -> int | None:
    """Index just past the brace group opening at `pos`; None when `pos` holds no `{` or it never closes."""
    if pos >= len(text) or text[pos] != "{":
        return None
    depth = 0
    for i in range(pos, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def remove_boxed(s: str | None) -> str | None:
    r"""The content of `\boxed{content}` (or `\fbox{content}`); None for anything else."""
    if not s:
        return None
    for macro in _BOX_MACROS:
        if s.startswith(macro + "{") and s.endswith("}"):
            return s[len(macro) + 1:-1]
    return None


def extract_boxed_answer(solution: str) -> str | None:
    r"""The content of the last `\boxed{...}` in `solution`; None when there is none."""
    return remove_boxed(last_boxed_only_string(solution))


def extract_answer(passage: str) -> str | None:
    r"""The last boxed answer of a response (None when it boxes nothing): what the graders compare."""
    if not any(macro in passage for macro in _BOX_MACROS):
        return None
    return extract_boxed_answer(passage)


# ----------------------------------------------------------------- MATH-benchmark normalisation (mathd)


class _Unreadable(ValueError):
    """A TeX fragment the normaliser cannot rewrite (e.g. `\\frac` with nothing after it)."""


def _brace_short_fracs(s: str) -> str:
    r"""`\frac12` -> `\frac{1}{2}`, `\frac1{2}` -> `\frac{1}{2}`; braced numerators are left alone."""
    head, *parts = s.split("\\frac")
    out = [head]
    for part in parts:
        if not part:
            raise _Unreadable(s)
        if part[0] == "{":
            out.append("\\frac" + part)
            continue
        if len(part) < 2:
            return s  # "\frac1" at the very end: give up on fractions, keep the rest of the rules
        numerator, second, rest = part[0], part[1], part[2:]
        if second == "{":
            out.append("\\frac{" + numerator + "}{" + rest)
        else:
            out.append("\\frac{" + numerator + "}{" + second + "}" + rest)
    return "".join(out)


def _brace_short_sqrts(s: str) -> str:
    r"""`\sqrt3` -> `\sqrt{3}` (one character under the root)."""
    head, *parts = s.split("\\sqrt")
    out = [head]
    for part in parts:
        if not part:
            raise _Unreadable(s)
        out.append("\\sqrt" + part if part[0] == "{" else "\\sqrt{" + part[0] + "}" + part[1:])
    return "".join(out)


def _slash_to_frac(s: str) -> str:
    r"""`3/4` -> `\frac{3}{4}` when both sides are plainly written integers."""
    numerator, slash, denominator = s.partition("/")
    if not slash or "/" in denominator:
        return s
    try:
        a, b = int(numerator), int(denominator)
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def _drop_trailing_units(s: str) -> str:
    r"""`5 \text{ cm}` -> `5 `: in MATH answers a `\text{` followed by a space introduces units."""
    if "\\text{ " not in s:
        return s
    parts = s.split("\\text{ ")
    if len(parts) != 2:
        raise _Unreadable(s)
    return parts[0]


def _mathd_rewrite(s: str) -> str:
    for gone in ("\n", "\\!"):
        s = s.replace(gone, "")
    s = s.replace("\\\\", "\\").replace("tfrac", "frac").replace("dfrac", "frac")
    for gone in ("\\left", "\\right", "^{\\circ}", "^\\circ", "\\$"):
        s = s.replace(gone, "")
    s = _drop_trailing_units(s).replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")  # a bare decimal point gets its leading zero
    if not s:
        return s
    if s.startswith("."):
        s = "0" + s
    lhs, eq, rhs = s.partition("=")
    if eq and "=" not in rhs and len(lhs) <= 2:  # "k = 3", "x=3": the value only
        s = rhs
    s = _brace_short_sqrts(s).replace(" ", "")
    s = _brace_short_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_to_frac(s)


_WHOLE_TEXT = re.compile(r"\\text\{(.+)\}", re.DOTALL)


def mathd_normalize_answer(answer: str | None) -> str | None:
    r"""`answer` written the MATH benchmark's way (see the module docstring); a fragment the rules cannot
    rewrite comes back stripped only. None stays None."""
    if answer is None:
        return None
    answer = answer.strip()
    whole = _WHOLE_TEXT.fullmatch(answer)
    if whole:
        answer = whole.group(1).strip()
    try:
        return _mathd_rewrite(answer)
    except _Unreadable:
        return answer


def grade_answer_mathd(given_answer: str | None, ground_truth: str | None) -> bool:
    """Whether the two answers are the same string once both are MATH-normalised."""
    return mathd_normalize_answer(ground_truth) == mathd_normalize_answer(given_answer)


# ------------------------------------------------------------------------------------- LaTeX to plain text

# Macros that stand for one character or operator; the plain text sympy (or a string comparison) reads.
_SYMBOLS = {
    "pi": "pi", "infty": "inf", "cup": "U", "cap": "∩", "cdot": "*", "times": "*", "ast": "*", "div": "/",
    "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠", "pm": "±", "mp": "∓",
    "approx": "≈", "to": "→", "rightarrow": "→", "in": "∈", "emptyset": "∅", "varnothing": "∅",
    "circ": "∘", "ldots": "…", "cdots": "…", "dots": "…", "mid": "|", "setminus": "∖", "angle": "∠",
    "lfloor": "⌊", "rfloor": "⌋", "lceil": "⌈", "rceil": "⌉", "langle": "⟨", "rangle": "⟩", "prime": "'",
    "quad": " ", "qquad": " ", "\\": " ", ",": " ", ";": " ", ":": " ", " ": " ", "!": "",
}
# Named functions keep their name (sympy knows most of them).
_FUNCTIONS = frozenset(
    "sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln lg exp max min gcd det deg dim lim"
    .split()
)
# Sizing and delimiter macros print nothing themselves.
_SILENT = frozenset("left right big Big bigg Bigg bigl bigr Bigl Bigr biggl biggr displaystyle textstyle".split())
_MACRO = re.compile(r"\\([A-Za-z]+|.)", re.DOTALL)
_ATOM = re.compile(r"-?[0-9]*\.?[0-9]+|[A-Za-z]|[^\x00-\x7f]")


class _LatexReader:
    """A recursive reader of the math-answer subset of LaTeX: groups, fractions, roots, `^`/`_`, symbols.

    Unknown macros are dropped and their arguments read as plain groups (`\\mathbf{x}` is `x`)."""

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def read(self, stop: str | None = None) -> str:
        out: list[str] = []
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            if ch == stop:
                return "".join(out)
            if ch == "{":
                out.append(self.group())
            elif ch == "}":  # an unmatched close brace
                self.pos += 1
            elif ch == "\\":
                out.append(self.macro())
            elif ch in "^_":
                self.pos += 1
                arg = self.argument()
                out.append(ch + (arg if _ATOM.fullmatch(arg) or ch == "_" else f"({arg})"))
            elif ch == "~":
                out.append(" ")
                self.pos += 1
            else:
                out.append(ch)
                self.pos += 1
        return "".join(out)

    def group(self) -> str:
        self.pos += 1  # the "{"
        inner = self.read(stop="}")
        self.pos += 1  # its "}" (or the end of the text)
        return inner

    def argument(self) -> str:
        """One macro argument: a `{group}`, a macro, or the next non-space character."""
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1
        if self.pos >= len(self.text):
            raise _Unreadable(self.text)
        ch = self.text[self.pos]
        if ch == "{":
            return self.group()
        if ch == "\\":
            return self.macro()
        self.pos += 1
        return ch

    def optional(self) -> str | None:
        """A `[...]` argument (the index of `\\sqrt[3]{x}`), when one follows."""
        if self.pos < len(self.text) and self.text[self.pos] == "[":
            close = self.text.find("]", self.pos)
            if close > 0:
                inner = _LatexReader(self.text[self.pos + 1:close]).read()
                self.pos = close + 1
                return inner
        return None

    def macro(self) -> str:
        match = _MACRO.match(self.text, self.pos)
        if match is None:  # a lone backslash at the end
            self.pos += 1
            return ""
        name = match.group(1)
        self.pos = match.end()
        if name in ("frac", "dfrac", "tfrac", "cfrac"):
            numerator, denominator = self.argument(), self.argument()
            return f" {_wrapped(numerator)}/{_wrapped(denominator)}"  # the space: "7\frac34" is 7 + 3/4
        if name == "sqrt":
            index, radicand = self.optional(), self.argument()
            return f"sqrt({radicand})" if index is None else f"({radicand})^(1/({index}))"
        if name in ("binom", "dbinom", "tbinom"):
            top, bottom = self.argument(), self.argument()
            return f"binomial({top},{bottom})"
        if name in _SYMBOLS:
            return _SYMBOLS[name]
        if name in _FUNCTIONS:
            return name
        if name in _SILENT:
            if self.pos < len(self.text) and self.text[self.pos] == ".":  # "\left." is an empty delimiter
                self.pos += 1
            return ""
        if len(name) == 1:  # "\{", "\%", "\$", "\_": the character itself
            return name
        greek = _greek(name)
        return greek if greek is not None else ""


def _wrapped(part: str) -> str:
    part = part.strip()
    return part if _ATOM.fullmatch(part) else f"({part})"


@functools.cache
def _greek(name: str) -> str | None:
    base = name[3:] if name.startswith("var") else name
    case = "CAPITAL" if base[:1].isupper() else "SMALL"
    try:
        return unicodedata.lookup(f"GREEK {case} LETTER {base.upper()}")
    except KeyError:
        return None


def latex_to_text(expr: str) -> str:
    r"""`expr`'s LaTeX as plain text: `\frac{1+x}{2}` -> ` (1+x)/2`, `\sqrt{2}` -> `sqrt(2)`, `\pi` -> `pi`,
    `\cdot` -> `*`, `x^{2}` -> `x^2`; formatting macros disappear (`\mathbf{v}` -> `v`). Raises ValueError
    for a macro missing its argument."""
    return _LatexReader(expr).read().strip()


# --------------------------------------------------------------------------------- sympy equivalence

_UNIT_WORDS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month",
               "year", "foot", "feet", "inch", "yard")
_UNITS = re.compile("(?:" + "|".join(_UNIT_WORDS) + r")(?:es)?s? *(?:\^[0-9]+)?")
_SCALES = (("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12"))
_THOUSANDS_COMMA = re.compile(r"([0-9]),([0-9]{3})(?=$|[^0-9])")
_MIXED_NUMBER = re.compile(r"([0-9]) +([0-9])")  # "7 3/4" is 7 + 3/4


def _drop_thousands_commas(expr: str) -> str:
    """`1,234,567` -> `1234567`, leaving tuple commas such as `(1,2)` alone."""
    while True:
        shorter = _THOUSANDS_COMMA.sub(r"\1\2", expr)
        if shorter == expr:
            return expr
        expr = shorter


def _as_float(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError, OverflowError):
        return None


def _near_int(value: float) -> bool:
    try:
        return abs(value - round(value)) <= 1e-7
    except (OverflowError, ValueError):  # inf, nan
        return False


def _str_is_int(text: str) -> bool:
    value = _as_float(_drop_thousands_commas(text))
    return value is not None and _near_int(value)


def _is_frac(expr: str) -> bool:
    """A plain `p/q` of integers (with an optional single trailing character on either side)."""
    return re.fullmatch(r"-?[0-9]+.?/0*[1-9][0-9]*.?", expr) is not None


def _plain_expression(expr: str | None) -> str | None:
    """An answer as a lower-case, space-free plain expression for sympy, or for comparing as a string."""
    if expr is None:
        return None
    whole = _WHOLE_TEXT.fullmatch(expr)
    if whole:
        expr = whole.group(1)
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    for word, power in _SCALES:
        expr = expr.replace(word, power)
    expr = _UNITS.sub("", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr.startswith("{") and expr.endswith("}"):
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    value = _as_float(expr)
    if value is not None and _near_int(value):
        expr = str(round(value))
    if "\\" in expr:
        try:
            expr = latex_to_text(expr)
        except ValueError:
            pass
    expr = re.sub(r"- *", "-", expr)
    expr = _MIXED_NUMBER.sub(r"\1+\2", expr)
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _str_is_int(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def count_unknown_letters_in_expr(expr: str) -> int:
    """How many distinct letters (variables) `expr` uses, not counting those of `sqrt` and `frac`."""
    return len({ch for ch in expr.replace("sqrt", "").replace("frac", "") if ch.isalpha()})


# What sympy is never asked about: a third variable (free text, or names that would reach Python's eval),
# a braced or parenthesised exponent, a tower of exponents, a multi-digit exponent, and a factorial that is
# not of a literal of at most three digits (each could make simplify run for hours).
_UNSAFE = re.compile(r"\^\{|\^\(|\^[0-9]+\^|\^[0-9][0-9]+")
_SMALL_FACTORIAL = re.compile(r"(?<![0-9.])[0-9]{1,3}!(?!!)")


def should_allow_eval(expr: str) -> bool:
    """Whether `expr` is safe and quick enough to hand to sympy (see `_UNSAFE`)."""
    if count_unknown_letters_in_expr(expr) > 2 or _UNSAFE.search(expr):
        return False
    return expr.count("!") == len(_SMALL_FACTORIAL.findall(expr))


@functools.cache
def _sympy_namespace() -> dict[str, Any]:
    try:
        import sympy
    except ImportError as exc:  # torch depends on it, so this is a broken install
        raise ImportError(f"the math graders need sympy ({exc}): pip install sympy") from exc
    # sympy's public names and no builtins: the parser evaluates the text it builds.
    return {"__builtins__": {}, **{k: v for k, v in vars(sympy).items() if not k.startswith("_")}}


def _sympy_parse(expr: str) -> Any:
    from sympy.parsing import sympy_parser as sp

    transformations = sp.standard_transformations + (sp.implicit_multiplication_application,)
    return sp.parse_expr(expr.replace("^", "**"), local_dict={}, global_dict=_sympy_namespace(),
                         transformations=transformations)


def are_equal_under_sympy(ground_truth_normalized: str, given_normalized: str) -> bool:
    """Whether sympy simplifies `truth - given` to 0; False when the difference is unsafe to evaluate or
    does not parse."""
    difference = f"({ground_truth_normalized})-({given_normalized})"
    if not should_allow_eval(difference):
        return False
    simplify = _sympy_namespace()["simplify"]  # outside the try: a missing sympy is an error, not "unequal"
    try:
        return bool(simplify(_sympy_parse(difference)) == 0)
    except Exception:  # noqa: BLE001 - any parse or simplify failure means "not shown equal"
        return False


_BRACKETS = "()[]"


def split_tuple(expr: str) -> list[str]:
    """The elements of a tuple or interval (`(1,2]` -> ['1', '2']); any other expression is one element.
    Thousands commas are not element separators."""
    expr = _drop_thousands_commas(expr)
    if not expr:
        return []
    if (len(expr) > 2 and expr[0] in _BRACKETS and expr[-1] in _BRACKETS
            and not any(ch in _BRACKETS for ch in expr[1:-1])):
        return [elem.strip() for elem in expr[1:-1].split(",")]
    return [expr]


def _elements_equal(truth: str, given: str) -> bool:
    if _is_frac(truth) and _is_frac(given):
        return truth == given  # 2/4 is not an answer for 1/2: no simplifying here
    if _str_is_int(truth) != _str_is_int(given):
        return False  # an integer answer must be given as an integer
    return are_equal_under_sympy(truth, given)


def grade_answer_sympy(given_answer: str | None, ground_truth: str | None) -> bool:
    """Whether `given_answer` equals `ground_truth` as plain expressions (element-wise for tuples and
    intervals, whose brackets must agree), by sympy where string equality is not enough."""
    truth, given = _plain_expression(ground_truth), _plain_expression(given_answer)
    if truth is None or given is None:
        return False
    if truth == given:
        return True
    if not given:
        return False
    truth_elems, given_elems = split_tuple(truth), split_tuple(given)
    if len(truth_elems) > 1 and (truth[0] != given[0] or truth[-1] != given[-1]):
        return False
    if len(truth_elems) != len(given_elems):
        return False
    return all(_elements_equal(t, g) for t, g in zip(truth_elems, given_elems, strict=True))


def grade_answer_verl(solution_str: str, ground_truth: Any) -> bool:
    r"""Whether the last `\boxed{}` answer of `solution_str` matches `ground_truth` (itself boxed or not)
    by either grader. An empty ground truth or a response that boxes nothing is wrong."""
    if not ground_truth:
        return False
    truth: str | None = str(ground_truth)
    if "\\boxed" in truth:
        truth = extract_answer(truth)
    given = extract_answer(solution_str)
    if given is None:
        return False
    return grade_answer_mathd(given, truth) or grade_answer_sympy(given, truth)
