"""compose's `.env` reader, which both box programs need (stdlib only, Python >= 3.8).

The collector reads a box's `.env` and its secret files with it; the converge checks with it
that what it writes reads back as written, and edits a file statement by statement. Neither
program can import it on a box, where each runs alone as one text: reconciler/box_program.py
writes this module's text in where a program imports it, so the code is kept once here and
both programs read `.env` alike.
"""

import os

# The PATH under which the box programs run compose, docker and the login shell's trace
# (`env -i`): the deploy user's own PATH never decides which binary runs.
SCRUBBED_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# compose (v2.40, its compose-go v2.9 dotenv) reads `.env` as a stream of statements, not of
# lines: a quoted value may span lines, and after its closing quote the line may go on with a
# comment or with another statement (`A="x" B=2` assigns both). A key is letters, digits and
# `_.-[]` (`KEY: value` assigns too, `export ` before it is dropped; a key alone takes the
# environment's value). An unquoted value is the rest of its line, cut at the first ` #` (a
# space, not a tab, then `#`), trimmed. Single quotes keep everything but `\'` (a quote);
# double quotes also read `\n \t \r \a \b \f \v \\ \" \$` and `\0ooo`, and keep the backslash
# of any other escape. Unquoted and double-quoted values are interpolated (`$NAME`,
# `${NAME}`, `${NAME:-x}`, `-`, `:+`, `+`, `:?`, `?`; `$$` is `$`), from compose's own
# environment first, then from the keys the file assigned before; a key the environment holds
# takes the environment's value. compose refuses the WHOLE file for an unterminated quote, a
# key holding a space or another character, and a malformed or failing `${...}`.
# `_dotenv_read` reads it so, held to the real compose by tests/unit/
# test_dotenv_compose_parity.py.
_BLANK = "\t\x0b\x0c\r \x85\xa0"  # compose's isSpace: the blanks within a statement
_SPACE = _BLANK + "\n\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
_SPACE += "\u2028\u2029\u202f\u205f\u3000"  # Go's unicode.IsSpace (str.isspace() adds FS..US)
_EXPORT_GAP = "\t\n\x0c\r "  # Go's `\s` in compose's `^export\s+`
_KEY_MARKS = "_.-[]"
_NAME_FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_"
_NAME_REST = _NAME_FIRST + "0123456789"
_ESCAPES = {
    "a": "\x07", "b": "\x08", "f": "\x0c", "n": "\n", "r": "\r", "t": "\t", "v": "\x0b",
    "\\": "\\", '"': '"', "$": "$$", "c": "\\c",
}  # fmt: skip
_COMPOSE_ENV = {}  # type: dict


class _Refused(Exception):
    """compose refuses the whole file: args (line, why), no value in them."""


def _compose_env():
    """The environment compose reads `.env` in, as the reconciler runs it (`env -i PATH=...
    HOME=...`; the docker CLI adds the other two). PWD is the directory compose runs in, which
    a reader does not know: None, a value compose computes and the reader cannot."""
    if not _COMPOSE_ENV:
        _COMPOSE_ENV.update(
            PATH=SCRUBBED_PATH,
            HOME=os.path.expanduser("~"),
            PWD=None,
            DOCKER_CLI_PLUGIN_ORIGINAL_CLI_COMMAND="docker",
        )
    return _COMPOSE_ENV


def _dotenv_read(text, expand=True):
    """([(key, value, line, start, value_at, value_end, end)], None or (line, why)) for each
    statement of `text` as compose reads it, up to the one compose refuses (then the second
    item says where and why). `value` is None where compose computes it from what a reader
    cannot know (the PWD, a `${...}` form read here only as far as it is sure); offsets are
    into `text`: the statement, its value as written (value_at -1: a key alone) and its end;
    `line` counts from 1. expand=False: spans only, no value interpolated."""
    env = _compose_env()
    out = []  # type: list
    values = {}  # type: dict
    size = len(text)
    pos = 1 if text[:1] == "\ufeff" else 0  # compose drops a byte order mark
    line, counted = 1, 0
    try:
        while True:
            while pos < size:  # blanks, empty lines and comment lines before a statement
                char = text[pos]
                if char in _SPACE:
                    pos += 1
                elif char == "#":
                    pos = text.find("\n", pos)
                    pos = size if pos < 0 else pos
                else:
                    break
            if pos >= size:
                return out, None
            line += text.count("\n", counted, pos)
            counted = start = pos
            if text.startswith("export", pos) and pos + 6 < size and text[pos + 6] in _EXPORT_GAP:
                pos += 6
                while pos < size and text[pos] in _BLANK:
                    pos += 1
                if pos >= size:
                    raise _Refused(line, "`export` ends the file")
            end = text.find("=", pos)
            key = text[pos:end] if end > 0 else ""
            if not (key.isidentifier() and key.isascii()):  # else KEY=, nearly every line
                end = pos
                while end < size and text[end] not in "=:\n":
                    char = text[end]
                    if not (char in _BLANK or char.isalnum() or char in _KEY_MARKS):
                        raise _Refused(line, "a key holds an unexpected character")
                    end += 1
                if end >= size:  # a last key with no `=` and no line end: nothing
                    return out, None
                key = text[pos:end].rstrip(_SPACE)
                if " " in key:
                    raise _Refused(line, "a key holds a space")
                if text[end] == "\n":  # a key alone: the environment's value, if it has one
                    if key in env:
                        values[key] = env[key]
                        out.append((key, env[key], line, start, -1, end, end))
                    pos = end
                    continue
            pos = end + 1
            while pos < size and text[pos] in _BLANK:
                pos += 1
            value_at = pos
            quote = text[pos : pos + 1]
            if quote == '"' or quote == "'":
                found = _dotenv_quoted(text, pos + 1, quote)
                if found is None:
                    raise _Refused(line, "a quoted value never ends")
                value, pos = found
                value_end = pos
                if quote == '"' and expand:
                    value = _dotenv_expand(
                        _dotenv_escapes(value) if "\\" in value else value, values, env, line
                    )
            else:
                stop = text.find("\n", pos)
                stop = size if stop < 0 else stop
                value = text[pos:stop]
                cut = value.find(" #")
                value = (value if cut < 0 else value[:cut]).rstrip(_SPACE)
                value_end = pos + len(value)
                pos = stop
                if expand and "$" in value:
                    value = _dotenv_expand(value, values, env, line)
            if key in env:
                value = env[key]
            values[key] = value
            out.append((key, value, line, start, value_at, value_end, pos))
    except _Refused as exc:
        return out, exc.args


def _dotenv_quoted(text, at, quote):
    """(the characters of the value quoted up to `at`, the offset after its closing quote), or
    None when it never closes: `\\` and the quote is the quote, `\\` and any other character
    stay both (the next one is never the closing quote)."""
    parts = []
    while True:
        close = text.find(quote, at)
        if close < 0:
            return None
        slash = text.find("\\", at, close)
        if slash < 0:
            parts.append(text[at:close])
            return "".join(parts), close + 1
        parts.append(text[at:slash])
        escaped = text[slash + 1]
        parts.append(escaped if escaped == quote else "\\" + escaped)
        at = slash + 2


def _dotenv_escapes(chars):
    """A double-quoted value's escapes read as compose reads them; `\\$` becomes `$$`, which
    interpolation then reads as `$`. `\\0` takes up to three digits: an octal byte value when
    they are three octal digits below 256, else the digits after a backslash (`\\012` is
    `\\12`: Go's strconv refuses it and compose keeps what it rewrote)."""
    out, at, size = [], 0, len(chars)
    while True:
        slash = chars.find("\\", at)
        if slash < 0 or slash + 1 >= size:
            out.append(chars[at:])
            return "".join(out)
        out.append(chars[at:slash])
        escaped = chars[slash + 1]
        if escaped in _ESCAPES:
            out.append(_ESCAPES[escaped])
            at = slash + 2
        elif escaped == "0":
            end = slash + 2
            while end < size and end < slash + 5 and chars[end] in "0123456789":
                end += 1
            digits = chars[slash + 2 : end]
            octal = len(digits) == 3 and "8" not in digits and "9" not in digits
            if octal and int(digits, 8) < 256:
                out.append(chr(int(digits, 8)))
            else:
                out.append("\\" + digits)
            at = end
        else:
            out.append("\\")
            at = slash + 1


def _dotenv_name_end(text, start):
    """Where the name `[A-Za-z_][A-Za-z0-9_]*` at `start` ends (`start`: no name there)."""
    end, size = start, len(text)
    if end < size and text[end] in _NAME_FIRST:
        end += 1
        while end < size and text[end] in _NAME_REST:
            end += 1
    return end


def _dotenv_expand(text, values, env, line):
    """`text` interpolated as compose does it; None where the result takes what a reader cannot
    know (the PWD, a nested or ambiguous `${...}`); _Refused where compose fails (the whole
    text is read: a failing `${...}` after an unknown one still fails)."""
    out, at, size, known = [], 0, len(text), True
    while True:
        dollar = text.find("$", at)
        if dollar < 0 or dollar + 1 >= size:  # a `$` at the end stays
            out.append(text[at:])
            return "".join(out) if known else None
        out.append(text[at:dollar])
        after = text[dollar + 1]
        if after == "$":
            out.append("$")
            at = dollar + 2
            continue
        if after != "{":
            end = _dotenv_name_end(text, dollar + 1)
            if end == dollar + 1:  # `$` before anything but a name stays
                out.append("$")
                at = dollar + 1
                continue
            name, operation, word, at = text[dollar + 1 : end], "", "", end
        else:
            close = text.find("}", dollar + 2)
            inner = text[dollar + 2 : max(close, 0)]
            if close < 0 or ("${" in inner and _dotenv_unbalanced(text, dollar)):
                raise _Refused(line, "a ${ is never closed")
            end = _dotenv_name_end(inner, 0)
            name, rest, at = inner[:end], inner[end:], close + 1
            operation = ""
            for operation in (":-", ":+", ":?", "-", "+", "?", ""):
                if rest.startswith(operation):
                    break
            word = rest[len(operation) :]
            if not name or (rest and not operation) or "\n" in word:
                raise _Refused(line, "a ${...} compose cannot read")  # its pattern's `.*`
            if _dotenv_ambiguous(operation, word):
                known = False  # nested, or read by compose in an order of its own
                continue
        if name in env:
            is_set, value = True, env[name]
        else:
            is_set, value = name in values, values.get(name, "")
        if operation == "+":
            out.append(word if is_set else "")
            continue
        if value is None:
            known = False
            continue
        if operation == ":+":
            value = word if value else ""
        elif (operation == ":-" and not value) or (operation == "-" and not is_set):
            value = word
        elif (operation == ":?" and not value) or (operation == "?" and not is_set):
            raise _Refused(line, "a required ${...} has no value")
        out.append(value)


def _dotenv_unbalanced(text, dollar):
    """Whether the `${` at `dollar` has no `}` closing it, a `${` inside it counting as one
    more to close: compose finds no end to it and refuses the template (`$$` before a `${`
    makes it text: unknown here, not refused)."""
    if "$$" in text[dollar : text.find("}", dollar)]:
        return False
    depth, at = 0, dollar
    while True:
        brace = text.find("}", at)
        opening = text.find("${", at)
        if 0 <= opening < brace:
            depth, at = depth + 1, opening + 2
        elif brace < 0:
            return True
        else:
            depth -= 1
            if depth == 0:
                return False
            at = brace + 1


def _dotenv_ambiguous(operation, word):
    """Whether compose may read `${NAME<operation><word>}` otherwise than the shell does: it
    tries `:?`, `?`, `:-`, `-` and the `+` forms in an order of its own, each splitting at
    the first place its mark appears; with one mark only, all agree. A nested `${` or a `$`
    is not read here either."""
    if "$" in word or "{" in word or "?" in word or "+" in word:
        return True
    if ":-" in word:
        return True
    return "-" in word and operation not in (":-", "-")


def _dotenv_joins(text, statements):
    """[(first line, how many lines follow it)] for each statement whose quoted value goes on
    past its line (lines counted from 0)."""
    joins = []
    for statement in statements:
        inside = text.count("\n", statement[3], statement[6])
        if inside:
            joins.append((statement[2] - 1, inside))
    return joins


def _dotenv_lines(text, joins=None):
    """`text` cut at each LF that ends a statement's line, as compose reads it: not inside a
    quoted value. A lone CR or another break (VT, FF, NEL, U+2028...) is inside its line;
    str.splitlines() cut there, and a value holding one read as two lines, the text after it
    (`x<U+2028>GATEWAY_API_KEY=`) as an entry of its own."""
    lines = text.split("\n")
    if not lines[-1]:
        lines.pop()  # "" after a final LF is no line
    if joins is None:
        joins = (
            _dotenv_joins(text, _dotenv_read(text, False)[0]) if "'" in text or '"' in text else []
        )
    for first, count in reversed(joins):
        lines[first : first + count + 1] = ["\n".join(lines[first : first + count + 1])]
    return lines


def _dotenv_line_index(joins, line):
    """The index in `_dotenv_lines` of the line holding physical line `line` (from 0)."""
    return line - sum(min(count, line - first) for first, count in joins if first < line)


def _secret_file_values(text):
    """{key: value} of a box_file secret's file. A dotenv file (`.secrets.env`) is read as
    compose reads it; a file compose refuses as a whole, such as a shell's rc file (`~/.bashrc`:
    `export KEY=...` among shell code, where the importer points a key only a login shell
    exports), a line at a time, each line as compose would read it alone, a line it would
    refuse skipped. The last assignment of a key wins."""
    statements, problem = _dotenv_read(text)
    groups = [statements] if problem is None else []
    if problem is not None:
        for line in text.split("\n"):
            found, refused = _dotenv_read(line)
            if refused is None:
                groups.append(found)
    values = {}  # type: dict
    for group in groups:
        for statement in group:
            key, value = statement[0], statement[1]
            if not (key.isidentifier() and key.isascii()):
                continue
            if value is None:
                values.pop(key, None)  # computed from what the box cannot know: absent
            else:
                values[key] = value
    return values


def _line_end(text, at):
    end = text.find("\n", at)
    return len(text) if end < 0 else end


def _removal(text, start, end):
    """(start, end, "") taking the statement at text[start:end] out: its whole line, the line
    ending included, when nothing but blanks and a comment is left on it."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = _line_end(text, end)
    before, after = text[line_start:start], text[end:line_end].lstrip(_BLANK)
    if not before.strip(_BLANK) and (not after or after.startswith("#")):
        return line_start, min(line_end + 1, len(text)), ""
    return start, end, ""
