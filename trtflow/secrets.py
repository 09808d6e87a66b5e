"""Secrets in URLs: where they sit (a userinfo password, or the value of a query key that names one) and the one rule
for what is said of such a URL. A URL is printed, recorded in files and posted to Prefect: one holding a secret is
either shown without it (the Prefect server's database) or refused where it would be recorded as an identity (an
artifact store's location)."""
from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

SECRET_WORDS = ("pass", "pwd", "secret", "token", "key", "credential")  # password, passwd, sslpassword, sslkey, ...


def secret_key(key: str) -> bool:
    """A URL query key whose value is a secret (`?password=`, `?sslpassword=`, `?token=`): never said."""
    return any(word in key.lower() for word in SECRET_WORDS)


def holds_secret(url: str) -> bool:
    """The URL carries a password in its userinfo, or a value under a query key that names a secret."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # a URL that cannot be read: treat what it may hold as a secret
        return True
    return password is not None or any(secret_key(k) for k, _ in parse_qsl(parts.query, keep_blank_values=True))
