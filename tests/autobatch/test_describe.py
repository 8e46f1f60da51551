"""ab.describe: golden text on fib (blocks, variables, allocation classes, optimizations)."""
import io

import pytest

from tests.autobatch.programs import fib
from tfx_vec import autobatch as ab

GOLDEN = """\
program fib(fib.n) -> fib.retval_
  entry fib: block 0
  0: fib.0:
      fib._ab_t1 = prim(fib.n)  # _ab_t1 = n <= 1
      branch fib._ab_t1 ? fib.1 : fib.2
  1: fib.1:
      fib.retval_ = prim(fib.n)  # retval_ = tf.ones_like(n)
      return
  2: fib.2:
      fib._ab_t2, fib._ab_t3 = prim(fib.n)  # _ab_t2 = n - 2; _ab_t3 = n - 1
      push fib._ab_t3
      fib.n = prim(fib._ab_t2)  # fib.n = fib._ab_t2
      pushjump fib.0 then fib.2/1
  3: fib.2/1:
      pop fib._ab_t3
      fib._ab_t4 = prim(fib.retval_)  # fib._ab_t4 = fib.retval_
      push fib._ab_t4
      fib.n = prim(fib._ab_t3)  # fib.n = fib._ab_t3
      pushjump fib.0 then fib.2/2
  4: fib.2/2:
      pop fib._ab_t4
      fib._ab_t5 = prim(fib.retval_)  # fib._ab_t5 = fib.retval_
      fib.retval_ = prim(fib._ab_t4, fib._ab_t5)  # retval_ = _ab_t4 + _ab_t5
      return
variables:
  fib.n: register
  fib._ab_t1: temporary
  fib.retval_: register
  fib._ab_t2: temporary
  fib._ab_t3: stack
  fib._ab_t4: stack
  fib._ab_t5: temporary
passes and optimizations:
  - frontend
  - jump threading: 0 branches skipped where flags decide them
  - tail calls: 0 self calls in tail position became jumps to the entry
  - lowering: calls -> caller-saves push/pop on one stack per variable (optimization 1: per-variable stacks)
  - stack elision: 0 push/pop pairs removed around calls that cannot recurse (optimization 3)
  - pop-push fusion: 0 pop/push pairs fused into peek/update (optimization 5)
  - static returns: 0 of 1 functions return to a single address (no program-counter stack traffic for their calls and returns)
  - result forwarding: not applicable
  - block merging: per input signature (needs the variables' shapes)
  - layout: source order
  - allocation: 3 temporaries never stored (optimization 2), 2 registers without stacks, 2 stacks with cached tops (optimization 4)
"""


def test_describe_fib_golden():
    out = io.StringIO()
    text = ab.describe(fib, file=out)
    assert text == out.getvalue() == GOLDEN


def test_describe_rejects_plain_functions():
    with pytest.raises(ab.AutobatchError, match="ab.function"):
        ab.describe(lambda n: n)
