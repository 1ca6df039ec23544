"""xgrammar against llguidance on the default tokenizer: compile time per spec and the cost of one
token's mask, the two costs a structured request adds (README, "Structured outputs").

    python -m benchmarks.structured_backends [--repeats 5]

Specs: the 5-field schema of the serving scenario, a nested schema (arrays of objects), a regex,
a choice and an EBNF grammar. Compile: a fresh spec each repeat (a suffix in a name), so no cache
helps; median ms. Mask: one matcher walks a fixed valid output token by token, filling the mask
before each token; median microseconds per token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from engine.structured_output.params import StructuredOutputsParams

NESTED = {
    "type": "object",
    "properties": {
        "orders": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "items": {"type": "array", "items": {"type": "string"}},
                    "total": {"type": "number"},
                    "status": {"enum": ["open", "paid", "sent"]},
                },
                "required": ["id", "items", "total", "status"],
            },
        }
    },
    "required": ["orders"],
}


def specs(i: int, compact: bool) -> dict[str, tuple[StructuredOutputsParams, str]]:
    """name -> (a fresh spec, a valid output of it). Without free whitespace xgrammar writes JSON
    with ", " and ": ", llguidance without spaces (``compact``)."""
    from benchmarks.serving_structured import five_field_schema

    s = f"_{i}"
    sep = (",", ":") if compact else (", ", ": ")
    record = {
        f"name{s}": "Ada Lovelace",
        f"age{s}": 36,
        f"city{s}": "London",
        f"email{s}": "ada@example.com",
        f"active{s}": True,
    }
    nested = {**NESTED, "title": s}
    orders = {
        "orders": [
            {"id": 1, "items": ["tea", "cake"], "total": 7.5, "status": "paid"},
            {"id": 2, "items": ["milk"], "total": 1.25, "status": "open"},
        ]
    }
    return {
        "5-field schema": (
            StructuredOutputsParams(json=five_field_schema(s), disable_any_whitespace=True),
            json.dumps(record, separators=sep),
        ),
        "nested schema": (
            StructuredOutputsParams(json=nested, disable_any_whitespace=True),
            json.dumps(orders, separators=sep),
        ),
        "regex": (StructuredOutputsParams(regex=rf"[a-z]+@[a-z]+\.(com|org){i % 3}?"), "ada@example.com"),
        "choice": (StructuredOutputsParams(choice=[f"positive{s}", f"negative{s}", f"neutral{s}"]), f"neutral{s}"),
        "EBNF": (
            StructuredOutputsParams(grammar=f'root ::= "sum{s}: " n (" + " n)*\nn ::= [0-9]+'),
            f"sum{s}: 12 + 7 + 100",
        ),
    }


def main(argv=None) -> None:
    import tokenizers
    import torch

    from engine.models.default_model import default_tokenizer_path
    from engine.structured_output.backend_guidance import GuidanceBackend
    from engine.structured_output.backend_xgrammar import XgrammarBackend
    from engine.structured_output.vocab import load_vocabulary

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    path = default_tokenizer_path()
    tok = tokenizers.Tokenizer.from_file(f"{path}/tokenizer.json")
    vocab = load_vocabulary(path, 49152, 2)
    rows = []
    for backend_cls in (XgrammarBackend, GuidanceBackend):
        t0 = time.perf_counter()
        backend = backend_cls(vocab)
        setup_ms = (time.perf_counter() - t0) * 1e3
        compile_ms: dict[str, list[float]] = {}
        mask_us: dict[str, list[float]] = {}
        for i in range(a.repeats):
            for name, (spec, text) in specs(i, backend.name == "guidance").items():
                t0 = time.perf_counter()
                grammar = backend.compile(spec)
                compile_ms.setdefault(name, []).append((time.perf_counter() - t0) * 1e3)
                matcher = grammar.matcher()
                bitmask = torch.empty((1, (vocab.vocab_size + 31) // 32), dtype=torch.int32)
                ids = tok.encode(text, add_special_tokens=False).ids
                t0 = time.perf_counter()
                for token in ids:
                    matcher.fill_bitmask(bitmask, 0)
                    assert matcher.accept(token), (backend.name, name, token)
                mask_us.setdefault(name, []).append((time.perf_counter() - t0) * 1e6 / len(ids))
        for name in compile_ms:
            rows.append((backend.name, name, statistics.median(compile_ms[name]), statistics.median(mask_us[name])))
        print(f"{backend.name}: backend set-up (vocabulary, tokenizer tables) {setup_ms:.0f} ms")
    print("\n| backend | spec | compile ms (median) | mask + accept per token, us (median) |\n|---|---|---|---|")
    for backend, name, c, m in rows:
        print(f"| {backend} | {name} | {c:.2f} | {m:.1f} |")


if __name__ == "__main__":
    main()
