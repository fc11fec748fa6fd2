"""Answers built as bytes (cproxy/api/wire.py) say exactly what the dict shapes say."""

from __future__ import annotations

import orjson
import pytest

from cproxy.api import wire
from cproxy.broker import Handout, Pulled, delivery_json
from cproxy.model import AppendResult, Record

_KEYS = ["k1", None, 'q"uote\\', "caf\u00e9 \u2603", "tab\tnl\n\x01\x1f", "</script>", ""]


def _deliveries() -> list[Handout]:
    out = []
    for i, key in enumerate(_KEYS):
        headers = None if i % 3 == 0 else b"" if i % 3 == 1 else b'{"h":"v"}'
        m = Record("t\u00e9", i % 3, 2**40 + i, key, b'{"a": [1, 2.50]}', headers, None, 17 + i)
        body = None if i % 2 else b'"transformed"'
        out.append(Handout(m, 1 + i, run=i // 2, body_json=body))
    return out


@pytest.mark.parametrize("runs", [False, True])
def test_a_pull_answer_is_the_json_of_its_dict_shape(runs: bool) -> None:
    """Byte for byte: push requests use ``delivery_json``, pulls ``wire.pull_answer``."""
    result = Pulled(_deliveries(), 3, [("t", 1, 5)])
    expected = orjson.dumps(
        {
            "messages": [delivery_json(d, runs) for d in result.deliveries],
            "results": {"applied": 3, "unknown": [{"topic": "t", "qid": 1, "offset": 5}]},
        }
    )
    assert wire.pull_answer(result, runs) == expected


def test_an_empty_pull_answer() -> None:
    answer = wire.pull_answer(Pulled([], 0, []))
    assert answer == b'{"messages":[],"results":{"applied":0,"unknown":[]}}'


def test_a_produce_answer_is_the_json_of_its_dict_shape() -> None:
    results = [AppendResult(1, 2**40, False, 5), AppendResult(0, 7, True, 3)]
    expected = orjson.dumps(
        {"results": [{"qid": r.qid, "offset": r.offset, "duplicate": r.duplicate} for r in results]}
    )
    assert wire.produce_answer(results) == expected
