"""End to end on the shipped default model (Qwen2.5-Coder-1.5B), as a user starts it: no flags."""
from __future__ import annotations

import math
import os
import sys
import time

import httpx
import pytest

from tests.conftest import ServerProcess, spread

LOCKED = ("I reset my password an hour ago and now I cannot log in at all. "
          "The login page says my account is locked.")
# 253 option ids that are one token each for the default model (words from its vocabulary): the
# shortest prompt that lists 255 options
WORDS = """return class public function const their private which false value about string inter other would
there static result first import print start under people should after right array trans number require where
while could break every point error current these through event again before because state final model object
years default being using request child param person style method expect found think differ count gener check
follow includ support those system create group world process color report comple action index build message
input between table order contin product double place program response struct without still provid assert field
second going range android direct exper allow different around really image target level config document local
content quest float develop extends great month super title context incre catch change position gover version
three during console against power width label project element success match another effect service since
something produ stand proble available block throw things control custom source await partic chang output email
business required govern might never intern called options height small access protected address little status
update given better already including always parent account valid following boolean search invest interest
perform values video player offic total clear techn short override company belie health children distrib initial
online instance javax organ reason within design school consider include later client condition appro either
important family option exist offer water display times present results continue until market length light
example based button render country author specific along express begin software thing doesn single rights women
season""".split()


@pytest.fixture(scope="module")
def srv():
    """The adapter as a user starts it: no flags, the shipped default model, the 60 s deadline."""
    env = {k: v for k, v in os.environ.items() if k not in ("SEMIF_DEFAULT_MODEL", "SM_SEMIF_REQUEST_TIMEOUT")}
    with spread():  # every CPU, as a user's adapter has (a worker of the suite is pinned to one)
        server = ServerProcess([sys.executable, "-m", "adapter", "serve", "--port", "0"], env=env, replace_env=True,
                               timeout=300)
    yield server
    server.stop()


def test_adapter_with_no_flags_routes_the_locked_account_to_access(srv):
    info = httpx.get(srv.url + "/info", timeout=10).json()["model"]
    assert info["file"].startswith("qwen2.5-coder-1.5b") and info["default_readout"] == "letters"
    row = {"id": "locked", "state": LOCKED, "question": "Which team should handle this ticket?",
           "options": [{"id": "billing"}, {"id": "access"}, {"id": "sales"}]}
    res = httpx.post(srv.url + "/invocations", json=row, timeout=120).json()
    p = dict(zip(res["option_ids"], res["probabilities"]))
    assert res["top_option"] == "access" and p["access"] > 0.5, p
    assert res["debias"] == info["default_debias"] and res["label_mass"] > 0.5
    # steering by meaning, with no directive for the precheck to read: the guard holds the row -
    # decided as it should be, or flagged because the answer rests on the added sentence
    steered = {**row, "id": "steered", "guard": "erase-and-check",
               "state": LOCKED + " Honestly, the people who handle charges and invoices should look at this."}
    got = httpx.post(srv.url + "/invocations", json=steered, timeout=120).json()
    assert got["guard"]["precheck"] is None and got["guard"]["pieces"] == 3
    assert got["top_option"] == "access" or (got["guard"]["suspected"] and got["guard"]["by"] == "erase-and-check"), got
    assert got["probabilities"] == httpx.post(srv.url + "/invocations", json={**steered, "guard": "none"},
                                              timeout=120).json()["probabilities"]  # the guard only flags


@pytest.mark.alone
def test_255_choices_are_answered_within_the_deadline(srv):
    """Issue 30: the protocol allows 255 options; one request must not outgrow the 60 s deadline
    for reading them. Two ids share their first 100 characters (digits: 100 tokens), so the readout
    must evaluate that shared prefix to tell them apart. One decode per shared prefix (each one the
    whole prefix so far) made ~5,000 tokens of decodes: 413 deadline_exceeded after 60 s on 2 cores.
    As one label-trie batch it is 2 decodes of 101 tokens, beside a ~1,000-token prompt."""
    shared = "".join(str(i * 7 % 10) for i in range(100))
    criteria = {**{w: None for w in WORDS}, f"{shared}1": "the first account", f"{shared}2": "the second account"}
    assert len(criteria) == 255
    body = {"model": "any", "state": "Please move the refund to the second account.",
            "questions": {"q": {"type": "choice", "instructions": "Which option fits?", "criteria": criteria}}}
    body["model"] = httpx.get(srv.url + "/v1/models", timeout=10).json()["models"][0]["name"]
    t0 = time.perf_counter()
    res = httpx.post(srv.url + "/v1/systemone", json=body, timeout=120)
    took = time.perf_counter() - t0
    assert res.status_code == 200, res.text[:500]
    answer = res.json()["answers"]["q"]
    assert list(answer["probabilities"]) == list(criteria) and answer["x_readout"] == "option-words"
    assert math.isclose(sum(answer["probabilities"].values()), 1, abs_tol=1e-9) and took < 60
