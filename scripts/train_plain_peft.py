"""An SFT LoRA adapter for SmolLM2-135M-Instruct trained with transformers + PEFT alone — none of the workbench's
training code, config or run files — as a researcher would bring one from elsewhere. It ships in
examples/adapters/peft-sft-smollm2 so that every page and command can be checked on an adapter the workbench did
not make (tests/test_browser.py, tests/test_cli.py).

    .venv/bin/python scripts/train_plain_peft.py                      # into examples/adapters/peft-sft-smollm2
    .venv/bin/python scripts/train_plain_peft.py --out /tmp/peft-sft --steps 10

The base weights are the workbench's embedded copy of SmolLM2 (there is no model hub here); the adapter names the
hub checkpoint as its base model, as one trained from the hub would. The data: the faithful summaries of the
default data set's training documents (the first 80% of documents, as in the workbench's split).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from topl_core.foundations.paths import DEFAULT_DATA  # noqa: E402
from topl_core.models.loading import load_model  # noqa: E402  (the embedded base weights only)

OUT = REPO / "examples" / "adapters" / "peft-sft-smollm2"
HUB_BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
LORA = dict(
    r=8,
    lora_alpha=16,
    lora_dropout=0.05,
    target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
    layers_to_transform=list(range(21)),
    task_type="CAUSAL_LM",
)


def faithful_pairs(path: Path) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    docs = sorted({r["document"] for r in rows})
    train_docs = set(docs[: int(0.8 * len(docs))])
    pairs = {}
    for r in rows:
        summary = r["response"] if r.get("sequence_label") == 1 else r.get("faithful_response")
        if r["document"] in train_docs and summary:
            pairs[r["document"]] = summary
    return sorted(pairs.items())


def encode(tok, document: str, summary: str, max_len: int) -> tuple[list[int], list[int]]:
    """Chat-formatted prompt + summary; the loss is on the summary and its end-of-turn token only."""
    user = f"Summarize the following document.\n\nDocument:\n{document}"
    prompt = tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True)
    p = tok(prompt, add_special_tokens=False)["input_ids"][: max_len - 64]
    s = tok(summary + "<|im_end|>", add_special_tokens=False)["input_ids"][:64]
    return p + s, [-100] * len(p) + s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--data", default=str(REPO / DEFAULT_DATA))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--max-len", type=int, default=384)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    lm = load_model("smollm2-135m")
    tok, model = lm.tokenizer, get_peft_model(lm.model, LoraConfig(**LORA))
    model.print_trainable_parameters()
    examples = [encode(tok, d, s, args.max_len) for d, s in faithful_pairs(Path(args.data))]
    rng = random.Random(args.seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    model.train()
    for step in range(1, args.steps + 1):
        batch = rng.sample(examples, args.batch)
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([i + [tok.pad_token_id] * (width - len(i)) for i, _ in batch])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
        mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"step {step}/{args.steps} loss {loss.item():.4f}", flush=True)
    model.peft_config["default"].base_model_name_or_path = HUB_BASE
    model.save_pretrained(args.out, save_embedding_layers=False)  # no hub lookup: the embeddings are not trained
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
