"""split_between_processes's arithmetic, without a job: every size 0..3n for n = 1..8, plain and
padded, over lists, strings, tuples, ranges and dicts; and the padded shares against Accelerate's
rule, written out below, for every length 0..12 and n = 1..5."""
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


def accelerate_share(inputs, n, i, apply_padding):
    """Accelerate's PartialState.split_between_processes for a list (accelerate/state.py, 1.x):
    the first len % n processes take one more; a process past the end takes the last item; padding
    appends the input's last item up to ceil(len / n). One process takes everything."""
    if n == 1:
        return inputs
    per_process, extras = divmod(len(inputs), n)
    start = i * per_process + min(i, extras)
    end = start + per_process + (1 if i < extras else 0)
    result = inputs[-1:] if start >= len(inputs) else inputs[start:end]
    if apply_padding:
        result += [inputs[-1]] * (per_process + (1 if extras else 0) - len(result))
    return result


def against_accelerate():
    # Issue 46: padding repeated the last item of the process's own share (10 items on 4
    # processes, process 2: [6, 7, 7], Accelerate's [6, 7, 9]).
    check(_split(list(range(10)), 4, 2, True) == [6, 7, 9], "10 items, 4 processes, process 2")
    for size in range(0, 13):
        items = list(range(size))
        for n in range(1, 6):
            for i in range(n):
                ours = _split(items, n, i, True)
                if size == 0:  # Accelerate's padding raises IndexError on an empty list
                    check(ours == [], f"padded empty n={n}")
                    continue
                want = accelerate_share(list(items), n, i, True)
                check(ours == want, f"padded size={size} n={n} i={i}: {ours}, Accelerate {want}")
                # Unpadded, a process past the end takes nothing here (each item once), where
                # Accelerate's takes the last item again (docs/guide.md says so).
                plain = accelerate_share(list(items), n, i, False)
                expected = [] if i >= size else plain
                check(_split(items, n, i, False) == expected, f"plain size={size} n={n} i={i}")


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
    check(_split(b"abcde", 3, 2, True) == b"ee", "bytes padded with the input's last")


def main():
    against_accelerate()
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
                    check(all(x == items[-1] for x in fill), f"padding {share}")
            else:
                check(all(share == [] for share in padded), f"padded empty n={n}")
            for kind in (tuple, lambda xs: "".join(chr(97 + x % 26) for x in xs), range):
                seq = kind(items) if kind is not range else range(size)
                joined = [_split(seq, n, i, False) for i in range(n)]
                check(sum((list(s) for s in joined), []) == list(seq), f"{type(seq)} n={n}")
    # A dict's strings and bytes pass whole, as Accelerate's (issue 46: they were sliced), and
    # their lengths are not the sequences'.
    both = {"a": [1, 2, 3, 4, 5], "b": ("x", "y", "z", "v", "w"), "name": "run", "raw": b"\0"}
    check(_split(both, 2, 0, False) == {"a": [1, 2, 3], "b": ("x", "y", "z"), "name": "run",
                                        "raw": b"\0"}, "dict share 0")
    check(_split(both, 3, 2, True) == {"a": [5, 5], "b": ("w", "w"), "name": "run",
                                       "raw": b"\0"}, "dict padded share 2")
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
