"""Writes train.jsonl and test.jsonl beside this file: seeded one- and two-digit word problems, one per line.

python examples/word_problems/make_data.py
"""

import json
import random
from pathlib import Path

NAMES = ("Ana", "Ben", "Chloe", "Dev", "Ema", "Femi", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea")
THINGS = ("apples", "books", "coins", "marbles", "pencils", "stickers", "shells", "cards")


def problem(rng: random.Random) -> dict:
    name, thing, operation = (
        rng.choice(NAMES),
        rng.choice(THINGS),
        rng.choice(("addition", "subtraction") * 2 + ("multiplication", "division")),
    )
    a, b = rng.randint(10, 60), rng.randint(2, 39)
    if operation == "addition":
        question, answer, steps = f"{name} has {a} {thing} and gets {b} more. How many {thing} now?", a + b, f"{a}+{b}"
    elif operation == "subtraction":
        a = a + b
        question, answer, steps = f"{name} has {a} {thing} and gives away {b}. How many are left?", a - b, f"{a}-{b}"
    elif operation == "multiplication":
        a, b = rng.randint(2, 9), rng.randint(2, 12)
        question, answer, steps = f"{name} fills {a} bags with {b} {thing} each. How many {thing}?", a * b, f"{a}*{b}"
    else:
        b, answer = rng.randint(2, 9), rng.randint(2, 12)
        a = b * answer
        question, steps = f"{name} shares {a} {thing} equally among {b} friends. How many each?", f"{a}/{b}"
    return {"question": question, "answer": answer, "steps": f"{steps}={answer}", "operation": operation}


def main() -> None:
    rng, seen = random.Random(0), set()
    rows = []
    while len(rows) < 600:
        row = problem(rng)
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
    here = Path(__file__).parent
    for name, split in (("test.jsonl", rows[:200]), ("train.jsonl", rows[200:])):
        (here / name).write_text("".join(json.dumps(row) + "\n" for row in split))


if __name__ == "__main__":
    main()
