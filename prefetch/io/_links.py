"""URLs of http(s) listings and redirects: normalised, resolved, and kept inside their root.

`normalise` writes a URL the one way it is compared (unreserved escapes decoded, dot segments
removed, the path quoted); `resolve(folder, link)` is where an index page's link leads, or None
for a link that must not be followed (another scheme or host, an escaped "/" or backslash, a
query); `as_folder` is a URL with its one trailing "/"; `redirect_allowed` applies
`RemoteOptions.follow_redirects`. Pure functions of strings: prefetch.io._http calls them
before every request, so a root check compares what the client will really ask for.
"""

from __future__ import annotations

import html
import re
import urllib.parse

DEFAULT_PORTS = {"http": 80, "https": 443}
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# What may stay unquoted in a path we send (RFC 3986 pchar and "/"; "%" for existing escapes).
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"


def _origin(parts: urllib.parse.SplitResult) -> tuple[str, str, int | None]:
    scheme = parts.scheme.lower()
    try:
        port = parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:
        port = -1  # an invalid port never matches
    return scheme, (parts.hostname or "").lower(), port


def _decode_unreserved(text: str) -> str:
    """`%2e` -> `.`, `%41` -> `A`: escapes of unreserved characters decoded (RFC 3986 6.2.2.2:
    they mean the same), others upper-cased."""

    def one(match: re.Match[str]) -> str:
        character = chr(int(match.group(1), 16))
        return character if character in _UNRESERVED else "%" + match.group(1).upper()

    return _ESCAPE.sub(one, text)


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4: `/a/b/../c/./d` -> `/a/c/d` (never above the root); empty segments are
    kept (the caller refuses them)."""
    output: list[str] = []
    segments = path.split("/")
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "..":
            if len(output) > 1:
                output.pop()
            if last:
                output.append("")
        elif segment == ".":
            if last:
                output.append("")
        else:
            output.append(segment)
    return "/".join(output)


def normalise(url: str) -> str:
    """`url` as it is requested: unreserved escapes decoded, dot segments removed, characters
    that may not appear in a path quoted, no fragment. Idempotent."""
    parts = urllib.parse.urlsplit(_decode_unreserved(url.strip()))
    path = urllib.parse.quote(_remove_dot_segments(parts.path or "/"), safe=_PATH_SAFE)
    return urllib.parse.urlunsplit((parts.scheme.lower(), parts.netloc, path, parts.query, ""))


def as_folder(url: str) -> str:
    """`url` (normalised) with exactly one trailing "/"."""
    return normalise(url).rstrip("/") + "/"


def resolve(folder: str, link: str) -> str | None:
    """The URL an index page's `link` leads to from `folder` (a normalised URL ending in
    "/"), or None when it is not an entry of that folder: another scheme or host, a query
    (sort links), an encoded "/" or a backslash (ambiguous segments), a path that after
    decoding and dot removal is not strictly below `folder`, or one with an empty segment
    (`a//b`: it would walk back to itself). A folder entry keeps its trailing "/"."""
    link = html.unescape(link).strip().split("#", 1)[0]
    if not link or "?" in link or "\\" in link:
        return None
    link = _decode_unreserved(link)
    if re.search(r"%(2F|5C)", link, re.IGNORECASE):
        return None
    base = urllib.parse.urlsplit(folder)
    target = urllib.parse.urlsplit(link)
    if target.scheme:
        if target.scheme.lower() not in DEFAULT_PORTS:
            return None
    elif link.startswith("//"):
        target = urllib.parse.urlsplit(f"{base.scheme}:{link}")
    elif link.startswith("/"):
        target = base._replace(path=target.path)
    else:
        target = base._replace(path=base.path + target.path)
    if _origin(target) != _origin(base) or not target.netloc:
        return None
    path = urllib.parse.quote(_remove_dot_segments(target.path), safe=_PATH_SAFE)
    if not path.startswith(base.path) or len(path) <= len(base.path):
        return None
    rest = path[len(base.path) :]
    if "" in rest.rstrip("/").split("/") or rest.endswith("//"):
        return None
    return urllib.parse.urlunsplit((base.scheme, base.netloc, path, "", ""))


def redirect_allowed(origin: str, target: str, policy: str) -> bool:
    """Whether a redirect from a request to `origin` may go to `target` under `policy`."""
    to = urllib.parse.urlsplit(target)
    if to.scheme.lower() not in DEFAULT_PORTS:
        return False  # file://, ftp://, ...: never
    if policy == "any":
        return True
    if policy == "same-host":
        return _origin(to) == _origin(urllib.parse.urlsplit(origin))
    return False
