"""Factuality scorers: how well a summary is supported by its document, in [0, 1].

A `Scorer` scores claims against a document: `score(document, claims) -> list[float]`, one value in [0, 1] per
claim (1 = supported). Two protocols turn a summary into claims (docs/design.md §2, "Evaluation"):

- "sentence": split the summary into sentences (`split_sentences`), score each, and average;
- "full": score the whole summary as one claim.

Implementations:

- `GroundingScorer` (the offline default, no model): lexical grounding. For one claim it measures which content
  words, content bigrams, capitalised names and numbers of the claim also occur in the document, and combines
  them (see its docstring for the exact formula). Its quality is *measured*, not assumed: `scorer_quality`
  computes the AUROC of correct vs hallucinated summaries on CLIFF (per source) and on HaluEval pairs, caches the
  report, and the UI shows it next to any score from this scorer.
- `HubScorer`: an NLI cross-encoder or a MiniCheck model by Hugging Face id (needs a hub, or a local copy).
  "nli" models (e.g. "cross-encoder/nli-deberta-v3-base", "MoritzLaurer/DeBERTa-v3-large-mnli-fever-anli-ling-wanli")
  give P(entailment) from the label named like "entail"; "minicheck-lm" models ("bespokelabs/Bespoke-MiniCheck-7B")
  give P(Yes) / (P(Yes) + P(No)) for the next token after the MiniCheck prompt; "classifier" models
  ("lytang/MiniCheck-RoBERTa-Large", "lytang/MiniCheck-DeBERTa-v3-Large") give P(label 1). Long documents are cut
  into word chunks and a claim's score is its best chunk's (MiniCheck's rule).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import torch

from ...foundations.errors import ScorerError
from ...models.loading import hub_reachable
from .text import AnalysedText, analyse_text, split_sentences, stem

PROTOCOLS: tuple[str, ...] = ("sentence", "full")
DEFAULT_SCORER = "grounding"  # the offline lexical scorer (GroundingScorer)
SCORER_HELP = (  # the scorer setting of every config that scores generations
    "factuality scorer: 'grounding' (offline) or, with a hub, hub:nli:<id> / hub:classifier:<id> / "
    "hub:minicheck-lm:<id> (e.g. hub:minicheck-lm:bespokelabs/Bespoke-MiniCheck-7B)"
)


@runtime_checkable
class Scorer(Protocol):
    """Scores claims against a document. `name` identifies the scorer and its settings (cache keys, tables)."""

    name: str

    def score(self, document: str, claims: list[str]) -> list[float]:
        """One support probability in [0, 1] per claim."""
        ...


# --- protocols ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SummaryScore:
    """The score of one summary under one protocol, with the claims it was made of and their scores."""

    score: float
    protocol: str
    claims: tuple[str, ...]
    claim_scores: tuple[float, ...]

    @property
    def n_sentences(self) -> int:
        return len(self.claims) if self.protocol == "sentence" else 0


def claims_for(summary: str, protocol: str) -> list[str]:
    if protocol not in PROTOCOLS:
        raise ScorerError(f"protocol={protocol!r}: choose 'sentence' (score each sentence, average) or 'full'.")
    if protocol == "full":
        return [summary.strip()] if summary.strip() else []
    return split_sentences(summary)


def score_summary(scorer: Scorer, document: str, summary: str, protocol: str = "sentence") -> SummaryScore:
    """Score a summary: sentence protocol = mean of its sentences' scores; full protocol = one claim. An empty
    summary scores 0 (nothing is supported: an empty generation is not a faithful one)."""
    claims = claims_for(summary, protocol)
    if not claims:
        return SummaryScore(0.0, protocol, (), ())
    values = [float(v) for v in scorer.score(document, claims)]
    if len(values) != len(claims) or not all(0.0 <= v <= 1.0 for v in values):
        raise ScorerError(
            f"scorer {scorer.name!r} returned {values} for {len(claims)} claims: expected one value in [0, 1] each."
        )
    return SummaryScore(float(np.mean(values)), protocol, tuple(claims), tuple(values))


# --- the offline default: lexical grounding -------------------------------------------------------------------


@lru_cache(maxsize=64)  # a document is scored against several claims and protocols in a row
def _document_index(
    document: str,
) -> tuple[AnalysedText, frozenset[str], frozenset[tuple[str, str]], frozenset[str], frozenset[float]]:
    """What claims are looked up in: the document's stems, content bigrams, words and numbers (frozen: shared)."""
    a = analyse_text(document)
    stems = frozenset(a.content) | {stem(w) for w in a.words}
    bigrams = frozenset(zip(a.content, a.content[1:]))
    return a, stems, bigrams, frozenset(a.words), frozenset(a.numbers)


@dataclass(frozen=True)
class GroundingScorer:
    """Offline lexical grounding scorer (no model, no hub).

    For a claim c and document D (both lower-cased; light stemming; CLIFF's spaced hyphens joined):
      u = fraction of c's content-word stems that occur in D (stopwords and numbers excluded);
      b = fraction of c's adjacent content-stem bigrams that occur as adjacent content stems in D (order,
          relations: "A beat B" vs "B beat A");
      n = fraction of c's numbers (digits or number words, "three" = 3) that occur in D;
      e = fraction of c's capitalised names (not sentence-initial) whose lower-cased form occurs in D.
    score = (w_u·u + w_b·b) / (w_u + w_b) · n^γ_n · e^γ_e (defaults w_u = w_b = 0.5, γ_n = 1, γ_e = 0.5), with
    components that c lacks (no numbers, no names,
    fewer than two content words) left out (taken as 1 / not weighted). Unsupported numbers and names are the most
    common hallucinations in news summaries, so they multiply (one invented name out of two gives e = 0.5, a factor
    0.71 with γ_e = 0.5; names weigh less than numbers because reference summaries often carry bylines and
    demonyms that the document spells differently).
    Scores lie in [0, 1]; a claim with no content words scores 1 (nothing to contradict).
    """

    w_unigram: float = 0.5
    w_bigram: float = 0.5
    gamma_number: float = 1.0
    gamma_name: float = 0.5
    name: str = "grounding-v1"

    def __post_init__(self) -> None:
        if self.w_unigram < 0 or self.w_bigram < 0 or self.w_unigram + self.w_bigram <= 0:
            raise ScorerError(
                f"w_unigram={self.w_unigram}, w_bigram={self.w_bigram}: use non-negative weights, not both 0."
            )

    def components(self, document: str, claim: str) -> dict[str, float | None]:
        """The four components for one claim (None where the claim has nothing of that kind)."""
        return self._components(_document_index(document), claim)

    def _components(self, index, claim: str) -> dict[str, float | None]:
        _, stems, bigrams, words, numbers = index
        c = analyse_text(claim)
        u = float(np.mean([s in stems for s in c.content])) if c.content else None
        pairs = list(zip(c.content, c.content[1:]))
        b = float(np.mean([p in bigrams for p in pairs])) if pairs else None
        n = float(np.mean([x in numbers for x in c.numbers])) if c.numbers else None
        e = float(np.mean([x in words for x in c.names])) if c.names else None
        return {"unigram": u, "bigram": b, "number": n, "name": e}

    def _combine(self, comp: dict[str, float | None]) -> float:
        parts = [(self.w_unigram, comp["unigram"]), (self.w_bigram, comp["bigram"])]
        parts = [(w, v) for w, v in parts if v is not None and w > 0]
        lexical = sum(w * v for w, v in parts) / sum(w for w, _ in parts) if parts else 1.0
        score = lexical
        if comp["number"] is not None:
            score *= comp["number"] ** self.gamma_number
        if comp["name"] is not None:
            score *= comp["name"] ** self.gamma_name
        return float(min(1.0, max(0.0, score)))

    def score(self, document: str, claims: list[str]) -> list[float]:
        index = _document_index(document)
        return [self._combine(self._components(index, c)) for c in claims]


# --- scorers from a hub ----------------------------------------------------------------------------------------

HubKind = Literal["nli", "minicheck-lm", "classifier"]

MINICHECK_SYSTEM = (
    "Determine whether the provided claim is consistent with the corresponding document. Consistency in this context "
    "implies that all information presented in the claim is substantiated by the document. If not, it should be "
    "considered inconsistent. Please assess the claim's consistency with the document by responding with either "
    '"Yes" or "No".'
)


def _word_chunks(document: str, chunk_words: int, overlap: int = 32) -> list[str]:
    """Consecutive windows of at most `chunk_words` words covering the whole document, overlapping by
    min(overlap, chunk_words // 4) words."""
    words = document.split()
    if len(words) <= chunk_words:
        return [document]
    step = chunk_words - min(overlap, chunk_words // 4)
    chunks = []
    for i in range(0, len(words), step):
        chunks.append(" ".join(words[i : i + chunk_words]))
        if i + chunk_words >= len(words):
            break
    return chunks


class HubScorer:
    """A factual-consistency model by Hugging Face id or local path (needs a hub or a local copy; not offline).

    kind="nli": a sequence-pair classifier over (premise=document chunk, hypothesis=claim); the score is the
      softmax probability of the label whose name contains "entail" (config.id2label).
    kind="classifier": a binary sequence-pair classifier (MiniCheck RoBERTa/DeBERTa/Flan-T5 style); the score is
      P(label `positive_label`).
    kind="minicheck-lm": a causal LM prompted like Bespoke-MiniCheck (system prompt MINICHECK_SYSTEM, user
      "Document: …\\nClaim: …"); the score is P(Yes)/(P(Yes)+P(No)) of the next token.
    A document longer than `chunk_words` words is scored per chunk; a claim takes its highest chunk score.
    """

    def __init__(
        self,
        model_id: str,
        kind: HubKind = "nli",
        device: str = "cpu",
        chunk_words: int = 400,
        positive_label: int = 1,
        batch_size: int = 8,
        max_length: int = 512,
    ):
        if kind not in ("nli", "minicheck-lm", "classifier"):
            raise ScorerError(f"kind={kind!r}: choose 'nli', 'classifier' or 'minicheck-lm'.")
        self.model_id, self.kind, self.device = model_id, kind, device
        self.chunk_words, self.positive_label = chunk_words, positive_label
        self.batch_size, self.max_length = batch_size, max_length
        self.name = f"hub:{kind}:{model_id}"
        self._lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

        local = Path(self.model_id).expanduser().exists()
        if not local and not hub_reachable():
            raise ScorerError(
                f"HubScorer({self.model_id!r}) needs the Hugging Face hub, which is unreachable here, or a local "
                "directory with the model. Use the offline GroundingScorer (its measured AUROC is shown with its "
                "scores), or run where the hub is reachable."
            )
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_id)
            if self.kind == "minicheck-lm":
                self.model = AutoModelForCausalLM.from_pretrained(
                    self.model_id, dtype=torch.bfloat16 if self.device == "cuda" else torch.float32
                )
                yes = self.tokenizer.encode("Yes", add_special_tokens=False)
                no = self.tokenizer.encode("No", add_special_tokens=False)
                self._yes_no = (yes[0], no[0])
            else:
                self.model = AutoModelForSequenceClassification.from_pretrained(self.model_id)
        except OSError as e:
            raise ScorerError(
                f"could not load {self.model_id!r} ({str(e).splitlines()[0]}); check the id or the path."
            ) from e
        self.model.to(self.device).eval()
        if self.kind == "nli":
            labels = {i: str(l).lower() for i, l in self.model.config.id2label.items()}
            entail = [i for i, l in labels.items() if "entail" in l]
            if not entail:
                raise ScorerError(
                    f"{self.model_id}: no entailment label in id2label={labels}; use kind='classifier' with "
                    "positive_label set to the index that means 'supported'."
                )
            self._positive = entail[0]
        else:
            self._positive = self.positive_label

    def _minicheck_prompt(self, chunk: str, claim: str) -> str:
        user = f"Document: {chunk}\nClaim: {claim}"
        if getattr(self.tokenizer, "chat_template", None):
            msgs = [{"role": "system", "content": MINICHECK_SYSTEM}, {"role": "user", "content": user}]
            return self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return f"{MINICHECK_SYSTEM}\n\n{user}\nAnswer:"

    def _score_pairs(self, pairs: list[tuple[str, str]]) -> list[float]:
        out: list[float] = []
        for i in range(0, len(pairs), self.batch_size):
            chunk = pairs[i : i + self.batch_size]
            with torch.no_grad():
                if self.kind == "minicheck-lm":
                    self.tokenizer.padding_side = "left"
                    if self.tokenizer.pad_token is None:
                        self.tokenizer.pad_token = self.tokenizer.eos_token
                    enc = self.tokenizer(
                        [self._minicheck_prompt(d, c) for d, c in chunk],
                        return_tensors="pt",
                        padding=True,
                        add_special_tokens=False,
                    ).to(self.device)
                    logits = self.model(**enc).logits[:, -1].float()
                    two = torch.log_softmax(logits, -1)[:, list(self._yes_no)]
                    p = torch.softmax(two, -1)[:, 0]
                else:
                    enc = self.tokenizer(
                        [d for d, _ in chunk],
                        [c for _, c in chunk],
                        return_tensors="pt",
                        padding=True,
                        truncation="only_first",
                        max_length=self.max_length,
                    ).to(self.device)
                    p = torch.softmax(self.model(**enc).logits.float(), -1)[:, self._positive]
            out.extend(p.cpu().tolist())
        return out

    def score(self, document: str, claims: list[str]) -> list[float]:
        chunks = _word_chunks(document, self.chunk_words)
        pairs = [(ch, c) for c in claims for ch in chunks]
        with self._lock:
            flat = self._score_pairs(pairs)
        per = np.asarray(flat, dtype=np.float64).reshape(len(claims), len(chunks))
        return [float(v) for v in per.max(axis=1)]


def make_scorer(name: str = DEFAULT_SCORER, **kw) -> Scorer:
    """A scorer by name: "grounding" (offline default) or "hub:<kind>:<model id or path>" (HubScorer)."""
    if name in (DEFAULT_SCORER, "grounding-v1", "offline"):
        return GroundingScorer(**kw)
    if name.startswith("hub:"):
        _, kind, model_id = name.split(":", 2)
        return HubScorer(model_id, kind=kind, **kw)  # type: ignore[arg-type]
    raise ScorerError(
        f"scorer {name!r}: use 'grounding' (offline) or 'hub:nli:<model id>', 'hub:classifier:<id>', "
        "'hub:minicheck-lm:<id>' (e.g. hub:minicheck-lm:bespokelabs/Bespoke-MiniCheck-7B)."
    )
