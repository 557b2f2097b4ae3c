"""The implement-it harness: a correct function passes, a wrong one is named with its first bad case,
an untouched stub is "not implemented yet", a crash is a verdict."""

from simulators.exercises import ImplementIt, NotImplementedYet


def _blocks_needed(num_tokens, block_size):
    return -(-num_tokens // block_size)


TASK = ImplementIt("blocks_needed", _blocks_needed,
                   [dict(num_tokens=n, block_size=b) for n in (1, 15, 16, 17, 64) for b in (4, 16)])


def test_a_correct_function_passes():
    verdict = TASK.check(lambda num_tokens, block_size: (num_tokens + block_size - 1) // block_size)
    assert verdict.correct and verdict.answered


def test_a_wrong_function_is_told_its_first_failing_case():
    verdict = TASK.check(lambda num_tokens, block_size: num_tokens // block_size)
    assert not verdict.correct and verdict.answered
    assert "num_tokens=1, block_size=4" in verdict.why and "got 0, expected 1" in verdict.why


def test_a_stub_is_not_implemented_yet():
    def stub(num_tokens, block_size):
        raise NotImplementedYet

    verdict = TASK.check(stub)
    assert not verdict.answered and "not implemented yet" in str(verdict)


def test_a_crash_is_a_verdict():
    verdict = TASK.check(lambda num_tokens, block_size: num_tokens / 0)
    assert not verdict.correct and "ZeroDivisionError" in verdict.why
