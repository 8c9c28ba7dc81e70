"""Reading structured answers out of model replies."""

from __future__ import annotations

import json
import re
from typing import Any

_FENCE = re.compile(r"```(?:json)?")


def last_json_object(text: str) -> Any:
    """The JSON value that ends ``text`` (Markdown code fences and whitespace tolerated), or None when the text does
    not end with one. Text before it (reasoning, a preamble) is allowed.

    ```pycon
    >>> last_json_object('I think so.\\n```json\\n{"a": [1, {"b": 2}]}\\n```')
    {'a': [1, {'b': 2}]}
    >>> last_json_object('{"a": 1} and more') is None
    True

    ```
    """
    text = _FENCE.sub("", text).rstrip()
    if not text.endswith("}"):
        return None
    decoder = json.JSONDecoder()
    for start in (i for i in range(len(text) - 1, -1, -1) if text[i] == "{"):
        try:
            obj, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if end == len(text):
            return obj
    return None
