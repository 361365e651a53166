"""Random operation sequences against a pure-Python model of each sequence's tokens and KV cells.

After every step: each live sequence's tokens equal the model's, its KV positions are exactly
0..len-1 (llama_memory_seq_pos_min/max), the engine's used cells equal the model's count of
distinct cells, and closed sequences give back their slots and cells.

Cell model: a decoded token takes a new cell; a fork holds its parent's cells; a truncate drops the
tail's holds and leaves the next-token logits unknown, so the next generation re-decodes the last
token (its cell is replaced by a new one: the old one may still be a fork's)."""

from __future__ import annotations

import itertools
import os

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import pykvcompact as pk

N_CTX = 1024
N_SEQ_MAX = 6
token_lists = st.lists(st.integers(min_value=10, max_value=4000), min_size=1, max_size=24)


class SequenceModel(RuleBasedStateMachine):
    engine: pk.Engine = None  # set by the test function

    @initialize()
    def setup(self):
        self.live: list[dict] = []   # {"seq", "tokens", "cells", "rebase"}
        self.cell_ids = itertools.count()

    # -- model helpers ------------------------------------------------------------------------
    def new_cells(self, n):
        return [next(self.cell_ids) for _ in range(n)]

    def slots_used(self):
        return len(self.live) + sum(1 for e in self.live if e["rebase"] is not None)

    def model_used_cells(self):
        cells = set()
        for e in self.live:
            cells.update(e["cells"])
        return len(cells)

    def cells_upper_bound(self):
        # cells the engine may hold: live cells + everything a pending rebase may have prefilled
        extra = 0
        for e in self.live:
            rb = e["rebase"]
            if rb is not None:
                extra += len(rb["replacement"]) + len(e["tokens"])
        return self.model_used_cells() + extra

    def shared_cells(self, entry):
        cells = set()
        for e in self.live:
            if e is not entry:
                cells.update(e["cells"])
        return cells

    def room(self, n):
        return self.cells_upper_bound() + n + 48 <= N_CTX

    def pick(self, i):
        return self.live[i % len(self.live)]

    # -- rules --------------------------------------------------------------------------------
    @precondition(lambda self: self.slots_used() < N_SEQ_MAX)
    @rule(tokens=token_lists)
    def create(self, tokens):
        if not self.room(len(tokens)):
            return
        seq = self.engine.sequence(tokens)
        self.live.append({"seq": seq, "tokens": list(tokens), "cells": self.new_cells(len(tokens)), "rebase": None,
                          "valid": True})

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), tokens=token_lists)
    def append(self, i, tokens):
        e = self.pick(i)
        if not self.room(len(tokens)):
            return
        e["seq"].append(tokens)
        e["tokens"] += tokens
        e["cells"] += self.new_cells(len(tokens))
        e["valid"] = True

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), n=st.integers(0, 6))
    def generate(self, i, n):
        e = self.pick(i)
        if not e["tokens"] or not self.room(n):
            return
        before = self.engine.used_cells()
        out = e["seq"].generate(n)
        assert len(out) <= n
        if n > 0 and e["valid"] is not True:
            if e["valid"] is None:  # unknown after a commit: read which it was
                # one cell more than the tokens: the last token was decoded again and its old cell
                # stays a fork's; as many as the tokens: not re-decoded, or re-decoded in place of an
                # unshared cell (the model's count is the same either way)
                redecoded = self.engine.used_cells() - before - len(out) == 1
                if not redecoded:
                    e["valid"] = True
            if e["valid"] is not True:
                e["cells"][-1] = next(self.cell_ids)
        if n > 0:
            e["valid"] = True
        e["tokens"] += out
        e["cells"] += self.new_cells(len(out))

    @precondition(lambda self: self.live and self.slots_used() < N_SEQ_MAX)
    @rule(i=st.integers(0, 100))
    def fork(self, i):
        e = self.pick(i)
        f = e["seq"].fork()
        self.live.append({"seq": f, "tokens": list(e["tokens"]), "cells": list(e["cells"]), "rebase": None,
                          "valid": e["valid"]})

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), frac=st.floats(0, 1))
    def truncate(self, i, frac):
        e = self.pick(i)
        n = int(len(e["tokens"]) * frac)
        e["seq"].truncate(n)
        if n < len(e["tokens"]):
            e["valid"] = False
        e["tokens"] = e["tokens"][:n]
        e["cells"] = e["cells"][:n]
        rb = e["rebase"]
        if rb is not None and n < rb["keep_from"]:
            rb["valid"] = False

    @precondition(lambda self: self.live and self.slots_used() < N_SEQ_MAX)
    @rule(i=st.integers(0, 100), tokens=token_lists)
    def probe(self, i, tokens):
        e = self.pick(i)
        if not e["tokens"] or not self.room(len(tokens)):
            return
        p = e["seq"].probe(tokens)
        assert abs(sum(p.values()) - 1.0) < 1e-9 and all(0 <= v <= 1 for v in p.values())

    @precondition(lambda self: any(e["rebase"] is None for e in self.live) and self.slots_used() < N_SEQ_MAX)
    @rule(i=st.integers(0, 100), a=st.floats(0, 1), b=st.floats(0, 1), replacement=st.lists(st.integers(10, 4000), max_size=16))
    def prepare(self, i, a, b, replacement):
        free = [e for e in self.live if e["rebase"] is None]
        e = free[i % len(free)]
        n = len(e["tokens"])
        kp, kf = sorted((int(n * a), int(n * b)))
        if not self.room(len(replacement) + n):
            return
        rb = e["seq"].prepare_rebase(kp, replacement, kf)
        # the shadow shares the prefix cells the sequence has now (a later re-decode of the prefix's last
        # token, after a truncation, puts that token in a new cell of the sequence, not of the shadow)
        e["rebase"] = {"rb": rb, "keep_prefix": kp, "keep_from": kf, "replacement": list(replacement), "valid": True,
                       "prefix_cells": e["cells"][:kp]}

    @precondition(lambda self: any(e["rebase"] is not None for e in self.live))
    @rule(i=st.integers(0, 100))
    def commit(self, i):
        pending = [e for e in self.live if e["rebase"] is not None]
        e = pending[i % len(pending)]
        rb = e["rebase"]
        e["rebase"] = None
        if not rb["valid"]:
            with pytest.raises(pk.EngineError):
                e["seq"].commit_rebase(rb["rb"])
            return
        info = e["seq"].commit_rebase(rb["rb"])
        kp, kf = rb["keep_prefix"], rb["keep_from"]
        expect = e["tokens"][:kp] + rb["replacement"] + e["tokens"][kf:]
        e["cells"] = rb["prefix_cells"] + self.new_cells(len(expect) - kp)
        e["tokens"] = expect
        # The prepared sequence has next-token logits only if the commit waited for a catch-up
        # (a shadow asks for logits only then); otherwise they are recomputed on demand.
        e["valid"] = None if len(expect) > kp else False
        assert info["tokens_after"] == len(expect)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def close(self, i):
        e = self.pick(i)
        e["seq"].close()
        self.live.remove(e)

    # -- invariants ---------------------------------------------------------------------------
    steps_checked = 0

    @invariant()
    def sequences_match_model(self):
        SequenceModel.steps_checked += 1
        for e in self.live:
            seq = e["seq"]
            assert seq.tokens == e["tokens"]
            n = len(e["tokens"])
            assert seq.pos_range() == ((0, n - 1) if n else (-1, -1))

    @invariant()
    def cells_and_slots_match_model(self):
        st_ = self.engine.stats()
        assert st_["live_sequences"] == len(self.live)
        if all(e["rebase"] is None for e in self.live):
            assert self.engine.used_cells() == self.model_used_cells()
        else:
            assert self.engine.used_cells() <= self.cells_upper_bound()

    def teardown(self):
        for e in self.live:
            e["seq"].close()
        assert self.engine.used_cells() == 0
        assert self.engine.stats()["live_sequences"] == 0


def test_random_operations_match_model(tiny_model_path):
    with pk.Engine(tiny_model_path, n_ctx=N_CTX, n_seq_max=N_SEQ_MAX, seed=0) as eng:
        SequenceModel.engine = eng
        SequenceModel.TestCase.settings = settings(max_examples=int(os.environ.get("PYKVCOMPACT_STATEFUL_EXAMPLES", "60")), stateful_step_count=30, deadline=None,
                                                   suppress_health_check=list(HealthCheck))
        SequenceModel.steps_checked = 0
        SequenceModel.TestCase().runTest()
        # the machine really ran: many checked steps, not a vacuous pass
        assert SequenceModel.steps_checked >= 200
