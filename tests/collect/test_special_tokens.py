"""Pretrained inputs follow the tokenizer's own add_special_tokens convention (issue #15)."""

from __future__ import annotations

import pytest
import torch

from anistat.corpus import load_corpus
from anistat.data import PretrainedTokenizer, make_splits, mask_for_mlm
from anistat.errors import AnistatInputError
from anistat.protocol import DataSpec


def _tokenizer(template: str | None):
    """A real fast tokenizer (WordPiece trained on the built-in corpus) with a post-processor
    template: 'bert' = [CLS] $A [SEP], 'bos' = <s> $A, None = no special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = load_corpus(DataSpec())
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<s>"]
    tokenizer.train_from_iterator(
        list(corpus.documents[:200]),
        trainers.WordPieceTrainer(vocab_size=400, special_tokens=special, show_progress=False),
    )
    ids = {t: tokenizer.token_to_id(t) for t in special}
    if template == "bert":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])]
        )
    elif template == "long":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] <s> $A [SEP]",
            special_tokens=[("[CLS]", ids["[CLS]"]), ("<s>", ids["<s>"]), ("[SEP]", ids["[SEP]"])],
        )
    elif template == "bos":
        tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", ids["<s>"])])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        bos_token="<s>",
    )
    return PretrainedTokenizer(fast, identity=f"test-{template}"), ids


SPEC = dict(seq_len=16, n_fit_sequences=6, n_test_sequences=6, max_documents=200)


@pytest.mark.slow
@pytest.mark.parametrize(
    "template, prefix, suffix", [("bert", ["[CLS]"], ["[SEP]"]), ("bos", ["<s>"], []), (None, [], [])]
)
def test_blocks_carry_the_tokenizers_template(template, prefix, suffix):
    tokenizer, ids = _tokenizer(template)
    corpus = load_corpus(DataSpec(**SPEC))
    splits = make_splits(corpus, tokenizer, DataSpec(**SPEC), seed=0)
    assert splits.special_prefix == tuple(ids[t] for t in prefix)
    assert splits.special_suffix == tuple(ids[t] for t in suffix)
    for block in (splits.test, splits.fit, splits.train):
        assert block.shape[1] == 16
        for position, token in enumerate(prefix):
            assert (block[:, position] == ids[token]).all()
        for position, token in enumerate(reversed(suffix)):
            assert (block[:, -1 - position] == ids[token]).all()
    # `none` cuts raw blocks of the full length from the same stream
    raw = make_splits(corpus, tokenizer, DataSpec(**SPEC, special_tokens="none"), seed=0)
    assert raw.special_prefix == () and raw.maskable is None
    n_raw = raw.train.shape[0] + raw.test.shape[0]
    n_blocks = splits.train.shape[0] + splits.test.shape[0]
    content_len = 16 - len(prefix) - len(suffix)
    # the stream has 16·n_raw to 16·n_raw + 15 tokens, now cut into content_len-token blocks
    assert (16 * n_raw) // content_len <= n_blocks <= (16 * n_raw + 15) // content_len
    # the template's tokens are counted once per block of the model's input
    for token in prefix + suffix:
        assert splits.token_counts[ids[token]] == n_blocks + raw.token_counts[ids[token]]


def test_mlm_never_masks_the_template_and_keeps_the_other_draws():
    tokenizer, ids = _tokenizer("bert")
    corpus = load_corpus(DataSpec(**SPEC))
    splits = make_splits(corpus, tokenizer, DataSpec(**SPEC), seed=0)
    tokens = splits.train[:50]
    maskable = splits.maskable
    assert maskable.tolist() == [False] + [True] * 14 + [False]
    inputs, labels = mask_for_mlm(
        tokens, ids["[MASK]"], splits.vocab_size, 0.4, torch.Generator().manual_seed(0), maskable
    )
    assert (labels[:, 0] == -100).all() and (labels[:, -1] == -100).all()
    assert (inputs[:, 0] == ids["[CLS]"]).all() and (inputs[:, -1] == ids["[SEP]"]).all()
    assert ((labels != -100).sum(1) >= 1).all()
    plain_inputs, plain_labels = mask_for_mlm(
        tokens, ids["[MASK]"], splits.vocab_size, 0.4, torch.Generator().manual_seed(0)
    )
    inner = slice(1, 15)
    # a maskable position is selected exactly when it would be without the template, except the
    # guaranteed one per sequence, which moves off the template
    moved = (plain_labels[:, 0] != -100) | (plain_labels[:, -1] != -100)
    same = ~moved
    assert torch.equal(labels[same][:, inner], plain_labels[same][:, inner])


def test_seq_len_too_short_for_the_template_is_a_user_error():
    tokenizer, _ = _tokenizer("long")  # 3 template tokens
    corpus = load_corpus(DataSpec(**SPEC))
    short = {**SPEC, "n_test_sequences": 1, "n_fit_sequences": 1}
    short.pop("seq_len")
    with pytest.raises(AnistatInputError, match="special tokens"):
        make_splits(corpus, tokenizer, DataSpec(**short, seq_len=4), seed=0)
    assert make_splits(corpus, tokenizer, DataSpec(**short, seq_len=5), seed=0).test.shape[1] == 5
