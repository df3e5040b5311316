"""Data: tokenisation, fixed-length sequences, disjoint splits, token frequencies.

The statistical sampling unit is the *sequence*: a block of `seq_len` consecutive tokens. The
corpus (a list of documents) is tokenised, each document's tokens are concatenated (documents
in their given order), cut into non-overlapping blocks, and the blocks are shuffled with the
protocol seed. The first `n_test_sequences` blocks form the test split (true gradients); the
next `n_fit_sequences` blocks the fit split (activations for the proxies); every block that is
not a test block may be used for training a built-in model. Test blocks are therefore never
trained on by built-in models and never used to fit a proxy.

Special tokens (`data.special_tokens`): a pretrained model sees its inputs as its tokenizer
makes them — `tokenizer(text)` adds e.g. BERT's `[CLS] … [SEP]` or a Llama-style BOS — so by
default (`tokenizer`) every block is `prefix + content + suffix` with the tokenizer's own
`add_special_tokens` template and `seq_len − len(prefix) − len(suffix)` content tokens; MLM
never masks those positions (as transformers' data collator does). `none` cuts raw content
blocks. Built-in tokenizers have no template. The documents come from `anistat.corpus`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .corpus import Corpus
from .errors import AnistatInputError
from .protocol import DataSpec

PAD_TOKEN = "<pad>"
MASK_TOKEN = "<mask>"
EOS_TOKEN = "<eos>"


@dataclass(frozen=True)
class Splits:
    """Token blocks of one tokenisation, split by seed (see module docstring)."""

    test: torch.Tensor  # (n_test, seq_len) int64
    fit: torch.Tensor  # (n_fit, seq_len) int64
    train: torch.Tensor  # (n_train, seq_len) int64, every non-test block
    test_documents: np.ndarray  # (n_test,) document index of each test block's first token
    token_counts: np.ndarray  # (vocab_size,) corpus-wide counts, for frequency analysis
    vocab_size: int
    mask_token_id: int | None
    pad_token_id: int | None
    decode: Callable[[list[int]], str] = field(repr=False, compare=False)
    tokenizer_id: str = ""
    special_prefix: tuple[int, ...] = ()  # the tokenizer's special tokens before every block's content
    special_suffix: tuple[int, ...] = ()  # ... and after it

    @property
    def maskable(self) -> torch.Tensor | None:
        """(seq_len,) bool: positions MLM may mask (not the special-token template); None = all."""
        if not (self.special_prefix or self.special_suffix):
            return None
        seq_len = self.test.shape[1]
        mask = torch.ones(seq_len, dtype=torch.bool)
        mask[: len(self.special_prefix)] = False
        if self.special_suffix:
            mask[seq_len - len(self.special_suffix) :] = False
        return mask


# ----------------------------------------------------------------------------------------------
# tokenisers
# ----------------------------------------------------------------------------------------------
class BuiltinTokenizer:
    """A byte-level BPE trained on the corpus with the `tokenizers` library.

    Training is deterministic (same corpus and vocab size → same merges), so the built-in models
    are reproducible without any download.
    """

    def __init__(self, documents: tuple[str, ...], vocab_size: int):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[PAD_TOKEN, MASK_TOKEN, EOS_TOKEN],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(list(documents), trainer=trainer)
        self._tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.pad_token_id = tokenizer.token_to_id(PAD_TOKEN)
        self.mask_token_id = tokenizer.token_to_id(MASK_TOKEN)
        self.eos_token_id = tokenizer.token_to_id(EOS_TOKEN)
        self.identity = f"builtin-bpe-{self.vocab_size}"

    def encode_documents(self, documents: tuple[str, ...]) -> list[list[int]]:
        return [encoding.ids for encoding in self._tokenizer.encode_batch(list(documents))]

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(list(ids))

    def special_template(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """No special-token template: the built-in models are trained on raw blocks."""
        return (), ()


class PretrainedTokenizer:
    """The tokenizer saved beside a Hugging Face model (`AutoTokenizer`, local files only)."""

    def __init__(self, tokenizer: Any, identity: str):
        self._tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.pad_token_id = tokenizer.pad_token_id
        self.mask_token_id = tokenizer.mask_token_id
        self.eos_token_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
        self.identity = identity

    def encode_documents(self, documents: tuple[str, ...]) -> list[list[int]]:
        encoded = self._tokenizer(list(documents), add_special_tokens=False, verbose=False)
        return encoded["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(list(ids))

    def special_template(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(prefix, suffix) ids the tokenizer's `add_special_tokens=True` puts around a text:
        read off by encoding one probe text both ways (works for slow and fast tokenizers and
        for post-processors such as BERT's `[CLS] $A [SEP]` or a BOS template)."""
        probe = "anistat probe text"
        bare = list(self._tokenizer(probe, add_special_tokens=False)["input_ids"])
        full = list(self._tokenizer(probe, add_special_tokens=True)["input_ids"])
        for start in range(len(full) - len(bare) + 1):
            if full[start : start + len(bare)] == bare:
                return tuple(full[:start]), tuple(full[start + len(bare) :])
        return (), ()  # the template changes the text's own ids: leave the inputs raw


def make_splits(corpus: Corpus, tokenizer: BuiltinTokenizer | PretrainedTokenizer, spec: DataSpec, seed: int) -> Splits:
    """Tokenise, cut into blocks, shuffle by seed and split (see module docstring)."""
    prefix, suffix = tokenizer.special_template() if spec.special_tokens == "tokenizer" else ((), ())
    content_len = spec.seq_len - len(prefix) - len(suffix)
    if content_len < 2:
        raise AnistatInputError(
            f"data.seq_len {spec.seq_len} leaves {content_len} content tokens after the tokenizer's "
            f"{len(prefix) + len(suffix)} special tokens; raise seq_len or set data.special_tokens: none"
        )
    encoded = tokenizer.encode_documents(corpus.documents)
    stream: list[int] = []
    document_of_token: list[int] = []
    for index, ids in enumerate(encoded):
        if tokenizer.eos_token_id is not None:
            ids = list(ids) + [tokenizer.eos_token_id]
        stream.extend(ids)
        document_of_token.extend([index] * len(ids))
    n_tokens = len(stream)
    if n_tokens < content_len:
        raise AnistatInputError(
            f"data: the corpus has {n_tokens} tokens, fewer than one sequence of seq_len={spec.seq_len}"
        )
    n_blocks = n_tokens // content_len
    needed = spec.n_test_sequences + spec.n_fit_sequences
    if n_blocks < needed:
        raise AnistatInputError(
            f"data: the corpus gives {n_blocks} sequences of {spec.seq_len} tokens, but "
            f"n_test_sequences + n_fit_sequences = {needed}; lower them or add text"
        )
    tokens = torch.tensor(stream[: n_blocks * content_len], dtype=torch.int64).view(n_blocks, content_len)
    first_document = np.asarray(document_of_token[::content_len][:n_blocks], dtype=np.int64)
    if prefix or suffix:
        tokens = torch.cat(
            [
                torch.tensor(prefix, dtype=torch.int64).expand(n_blocks, -1),
                tokens,
                torch.tensor(suffix, dtype=torch.int64).expand(n_blocks, -1),
            ],
            dim=1,
        )
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(n_blocks, generator=generator)
    test_index = order[: spec.n_test_sequences]
    fit_index = order[spec.n_test_sequences : needed]
    train_index = order[spec.n_test_sequences :]
    counts = np.bincount(np.asarray(stream, dtype=np.int64), minlength=tokenizer.vocab_size)
    if prefix or suffix:  # the template's tokens occur once per block of the model's input
        special = np.bincount(np.asarray(prefix + suffix, dtype=np.int64), minlength=counts.shape[0]) * n_blocks
        counts = np.pad(counts, (0, special.shape[0] - counts.shape[0])) + special
    return Splits(
        test=tokens[test_index].clone(),
        fit=tokens[fit_index].clone(),
        train=tokens[train_index].clone(),
        test_documents=first_document[test_index.numpy()],
        token_counts=counts.astype(np.int64),
        vocab_size=int(max(tokenizer.vocab_size, counts.shape[0])),
        mask_token_id=tokenizer.mask_token_id,
        pad_token_id=tokenizer.pad_token_id,
        decode=tokenizer.decode,
        tokenizer_id=tokenizer.identity,
        special_prefix=tuple(int(t) for t in prefix),
        special_suffix=tuple(int(t) for t in suffix),
    )


def mask_for_mlm(
    tokens: torch.Tensor,
    mask_token_id: int,
    vocab_size: int,
    probability: float,
    generator: torch.Generator,
    maskable: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's 80/10/10 masking: returns (inputs, labels) with labels −100 where not predicted.

    At least one position per sequence is masked so every sequence carries a loss (and a
    gradient); randomness comes only from `generator`, so masks are reproducible. `maskable`
    (seq_len,) bool keeps the special-token template unmasked (the same draws are made, so
    positions that may be masked get the masks they would get without it).
    """
    probabilities = torch.rand(tokens.shape, generator=generator)
    if maskable is not None:
        probabilities = torch.where(maskable, probabilities, torch.full_like(probabilities, 2.0))
    selected = probabilities < probability
    # guarantee one prediction per sequence: the position with the smallest draw
    first = probabilities.argmin(dim=1)
    selected[torch.arange(tokens.shape[0]), first] = True
    labels = torch.where(selected, tokens, torch.full_like(tokens, -100))
    action = torch.rand(tokens.shape, generator=generator)
    random_tokens = torch.randint(0, vocab_size, tokens.shape, generator=generator)
    inputs = tokens.clone()
    inputs = torch.where(selected & (action < 0.8), torch.full_like(tokens, mask_token_id), inputs)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_tokens, inputs)
    return inputs, labels
