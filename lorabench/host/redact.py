"""What a bug bundle hides: secrets, told by what secrets look like, and nothing else.

A bundle is for debugging, so it keeps every setting (``tokenizer``,
``max_num_batched_tokens``, ``VLLM_USE_V1``) and hides only credentials:

- a value under a name that is a credential's, judged by the name's last word
  (``HF_TOKEN``, ``hf_token``, ``WANDB_API_KEY``, ``AWS_SECRET_ACCESS_KEY``,
  ``client_secret``, ``DB_PASSWORD``, ``Authorization``, ``apiKey``), never by a word
  inside it (``tokenizer``, ``max_num_batched_tokens``,
  ``VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD`` are settings). A flag value (``1``,
  ``true``) under such a name is kept: no credential is a flag;
- a value shaped like a credential wherever it stands: Hugging Face (``hf_...``),
  OpenAI-style (``sk-...``) and GitHub tokens, AWS access key ids, the credential of an
  ``Authorization`` scheme (``Bearer ...``, ``Basic ...``), and a URL's user part
  (``https://user:password@host``).

The same rules apply to environment dumps, logs and configs (docs/troubleshooting.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

REDACTED = "(redacted)"
# Values shorter than this are not replaced wherever they appear: "1" is no secret, and
# replacing it everywhere would garble a log.
SECRET_MIN_CHARS = 6

# The last word of a credential's name; "key" only with what makes it a credential's.
_CREDENTIAL_WORD = (
    r"(?i:token|secret|password|passwd|passphrase|credentials?|authorization"
    r"|(?:api|secret|access|private|auth|signing|encryption)[_.-]?key)"
)
# A whole name: words joined by _ . - or in camelCase, ending in a credential word and not
# followed by more of the name ("tokenizer", "..._TOKEN_THRESHOLD" go on).
_WORDS = rf"(?:[A-Za-z0-9]+[_.-]|[a-z0-9]+(?=[A-Z]))*{_CREDENTIAL_WORD}(?![\w.-])"
_SCHEME = r"(?:(?i:bearer|basic|token)\s+)?"
_HIDDEN = rf"(?!{re.escape(REDACTED)})"  # a value hidden already (a known secret) stays as it is
# A quoted value to its closing quote (spaces and all), an unquoted one to a space or delimiter.
_VALUE = rf"""(?P<quote>['"]?){_HIDDEN}(?P<value>(?<=['"])[^'"\n]+|{_SCHEME}[^\s'",;&)}}\]]+)"""
# name=value, name: value, 'name': 'value', "name": "value"
_ASSIGNED = re.compile(rf"""(?P<name>(?<![\w.-])-{{0,2}}{_WORDS})(?P<sep>['"]?\s*[:=]\s*){_VALUE}""")
# --name value, as on a command line
_OPTION = re.compile(rf"(?P<name>(?<![\w-])--{_WORDS})(?P<sep>\s+){_VALUE}")
_NAME_ONLY = re.compile(rf"-{{0,2}}{_WORDS}")
_FLAG = re.compile(r"(?i:[01]|true|false|yes|no|none|null)")

_SHAPES = (
    # Hugging Face user access tokens: hf_ and 34 letters and digits.
    (re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{20,}"), REDACTED),
    # OpenAI-style API keys (sk-..., sk-proj-...).
    (re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{16,}"), REDACTED),
    # GitHub tokens.
    (re.compile(r"(?<![A-Za-z0-9])(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,})"), REDACTED),
    # AWS access key ids.
    (re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Za-z0-9])"), REDACTED),
    # The credential after an Authorization scheme.
    (
        re.compile(rf"""(?<![\w-])(?P<scheme>(?i:bearer|basic))\s+{_HIDDEN}[^\s'",;)}}\]]+"""),
        rf"\g<scheme> {REDACTED}",
    ),
    # A URL's user part (user:password@, token@).
    (re.compile(r"""(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@'"]+@"""), rf"\g<scheme>{REDACTED}@"),
)


def is_secret_name(name: str) -> bool:
    """Whether a variable, argument or header of this name holds a credential."""
    return bool(_NAME_ONLY.fullmatch(name))


def _is_flag(value: object) -> bool:
    """A flag (None, a bool, 0/1, true/no): a number otherwise, as a config's
    ``"api_key": 12345678901`` is, may be the credential itself."""
    return value is None or isinstance(value, bool) or bool(_FLAG.fullmatch(str(value)))


def _hide_assigned(match: re.Match[str]) -> str:
    if _is_flag(match["value"]):
        return match[0]
    return f"{match['name']}{match['sep']}{match['quote']}{REDACTED}"


def scrub_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Text (a log, an environment dump) with every credential hidden: the given secret
    values wherever they appear, values under credential names, and credential shapes."""
    for value in secrets:
        text = text.replace(value, REDACTED)
    text = _ASSIGNED.sub(_hide_assigned, text)
    text = _OPTION.sub(_hide_assigned, text)
    for pattern, replacement in _SHAPES:
        text = pattern.sub(replacement, text)
    return text


def redact_tree(data: object) -> object:
    """A parsed config (or environment mapping) with the same rules: a credential-named
    key's value hidden (a flag kept), every string scrubbed of credential shapes."""
    if isinstance(data, Mapping):
        return {
            k: (REDACTED if is_secret_name(str(k)) and not _is_flag(v) else redact_tree(v)) for k, v in data.items()
        }
    if isinstance(data, list):
        return [redact_tree(v) for v in data]
    return scrub_text(data) if isinstance(data, str) else data


def secret_values(named: Iterable[tuple[str, object]]) -> list[str]:
    """The values under credential names (lists flattened) long enough to replace wherever
    they appear, longest first so that a value containing another goes whole."""
    flat = [x for k, v in named if is_secret_name(k) for x in (v if isinstance(v, list) else [v])]
    values = {str(x) for x in flat if isinstance(x, (str, int)) and not _is_flag(x) and len(str(x)) >= SECRET_MIN_CHARS}
    return sorted(values, key=len, reverse=True)
