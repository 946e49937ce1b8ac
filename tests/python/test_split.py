"""split_between_processes's arithmetic, without a job: every size 0..3n for n = 1..8, plain and
padded, over lists, strings, tuples, ranges and dicts."""
import sys

import lockstep
from lockstep import _split, split_range


def check(condition, what):
    if not condition:
        print(f"test_split: FAILED: {what}", file=sys.stderr)
        sys.exit(1)


class Elementwise:
    """A sequence whose `+` adds element by element (as a numpy array's does)."""

    def __init__(self, items):
        self.items = list(items)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, where):
        return Elementwise(self.items[where])

    def __add__(self, other):
        return Elementwise(a + b for a, b in zip(self.items, other.items))


def huge_sizes_and_kinds():
    # Issue 21: the padding came from float arithmetic (2**53 + 1 items on 2 processes padded 0,
    # 2**60 + 1 padded -1), and a sequence whose + adds was padded by adding.
    # The rule is liblockstep's now (lockstep_split_range): its ceiling wrapped at 2**64 - 1.
    for size in (2**53 + 1, 2**60 + 1, 2**63 + 1, 2**64 - 1):
        start, stop, padding = split_range(size, 2, 1, True)
        check(stop - start == size // 2 and padding == 1, f"size {size}: padding {padding}")
    for bad in ((2**64, 2, 0), (5, 0, 0), (5, 2, 2), (-1, 2, 0)):
        try:
            split_range(*bad)
            check(False, f"split_range{bad} was accepted")
        except ValueError:
            pass
    try:
        _split(Elementwise(range(5)), 2, 1, True)
        check(False, "a sequence whose + adds was padded")
    except TypeError as error:
        check("cannot pad a Elementwise" in str(error), f"message: {error}")
    check(_split(Elementwise(range(5)), 2, 1, False).items == [3, 4], "plain share of Elementwise")
    check(_split(b"abcde", 2, 1, True) == b"dee", "bytes padded")


def main():
    huge_sizes_and_kinds()
    for n in range(1, 9):
        for size in range(0, 3 * n + 1):
            items = list(range(size))
            shares = [_split(items, n, i, False) for i in range(n)]
            # Contiguous, in order, everything once; the first size % n take one more.
            check(sum(shares, []) == items, f"n={n} size={size}: shares {shares}")
            for i, share in enumerate(shares):
                want = size // n + (1 if i < size % n else 0)
                check(len(share) == want, f"n={n} size={size}: share {i} has {len(share)}")
                start, stop, padding = split_range(size, n, i)
                check(items[start:stop] == share and padding == 0, f"split_range n={n} i={i}")
            padded = [_split(items, n, i, True) for i in range(n)]
            if size:
                width = -(-size // n)
                for i, share in enumerate(padded):
                    check(len(share) == width, f"padded n={n} size={size}: share {i} {share}")
                    unpadded = shares[i]
                    check(share[:len(unpadded)] == unpadded, f"padded keeps the share: {share}")
                    fill = share[len(unpadded):]
                    check(all(x == (unpadded or items)[-1] for x in fill), f"padding {share}")
            else:
                check(all(share == [] for share in padded), f"padded empty n={n}")
            for kind in (tuple, lambda xs: "".join(chr(97 + x % 26) for x in xs), range):
                seq = kind(items) if kind is not range else range(size)
                joined = [_split(seq, n, i, False) for i in range(n)]
                check(sum((list(s) for s in joined), []) == list(seq), f"{type(seq)} n={n}")
    both = {"a": [1, 2, 3, 4, 5], "b": "abcde"}
    check(_split(both, 2, 0, False) == {"a": [1, 2, 3], "b": "abc"}, "dict share 0")
    check(_split(both, 2, 1, True) == {"a": [4, 5, 5], "b": "dee"}, "dict padded share 1")
    for bad in ((3, 0, 0), (3, 2, 2), (-1, 2, 0)):
        try:
            split_range(*bad)
            check(False, f"split_range{bad} accepted")
        except ValueError:
            pass
    try:
        _split({"a": [1], "b": [1, 2]}, 2, 0, False)
        check(False, "a dict of unequal lengths was accepted")
    except ValueError as error:
        check("different lengths" in str(error), str(error))
    print(f"test_split: ok (lockstep {lockstep.__version__})")


if __name__ == "__main__":
    main()
