"""The configuration sections: one dataclass per concern, every field with a default and its meaning.

A YAML file has up to five top-level sections, ``data``, ``tokenizer``, ``model``, ``train`` and
``decode``, one per dataclass here; it states only what it changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CorpusConfig:
    """One training corpus of ``data.corpora``: a pair of aligned files, its weight and its languages."""

    name: str = ""  # a short unique name, used in the log, metrics and cache file names
    src: str = ""  # source text, one sentence per line
    tgt: str = ""  # target text, line i translates line i of src
    weight: float = 1.0  # how strongly the corpus is sampled (data.sampling_temperature says how weights act)
    src_lang: str = ""  # source language code (e.g. en); empty = not stated
    tgt_lang: str = ""  # target language code; with several target languages each source starts with <2xx>
    tag: str = ""  # a piece put at the start of every source of this corpus, e.g. <BT> for back-translations


@dataclass
class ValidSetConfig:
    """One validation pair of ``data.valid``: loss and BLEU are reported per set, and their mean."""

    name: str = ""  # a short unique name, used in the log and metrics; empty = src_lang-tgt_lang
    src: str = ""  # validation source text
    tgt: str = ""  # validation target text
    src_lang: str = ""  # source language code
    tgt_lang: str = ""  # target language code (the tag its sources start with in a multilingual model)


@dataclass
class FiltersConfig:
    """Cleaning rules over raw text pairs, applied by `tmt clean` and, as ``data.filters``, when corpora are encoded;
    every rule is off by default."""

    duplicates: str = "off"  # off, exact (the same pair twice) or normalized (equal after case, digits, spaces)
    identical: bool = False  # drop pairs whose source equals their target (untranslated copies)
    min_words: int = 0  # drop pairs with fewer words than this on either side; 0 = off
    max_words: int = 0  # drop pairs with more words than this on either side; 0 = off
    max_ratio: float = 0.0  # drop pairs whose longer side has more than this times the words of the shorter; 0 = off
    max_nonletter: float = 0.0  # drop a side whose share of non-letter characters (spaces aside) exceeds this; 0 = off
    script: bool = False  # drop pairs whose letters are mostly outside the script of their corpus's language
    langid: bool = False  # drop pairs whose language identification disagrees (pip install -e ".[langid]")
    langid_min_prob: float = 0.0  # with langid: also drop pairs identified right but with less than this probability


@dataclass
class DataConfig:
    """Where the parallel corpora live, how they are mixed and how they are filtered."""

    train_src: str = ""  # training source text, one sentence per line (one corpus; data.corpora for several)
    train_tgt: str = ""  # training target text, line i translates line i of train_src
    valid_src: str = ""  # validation source text (loss, perplexity and BLEU during training)
    valid_tgt: str = ""  # validation target text
    # several training corpora, each {name, src, tgt, weight, src_lang, tgt_lang, tag}; replaces train_src/train_tgt
    corpora: list[CorpusConfig] = field(default_factory=list)
    # how corpora are mixed in an epoch: 0 = each corpus's pairs taken weight times (2 = twice, 0.5 = a different half
    # each epoch); T > 0 = shares proportional to (weight x pairs) ** (1 / T) (1: by size, 5: the multilingual papers'
    # flattening, large: uniform), over an epoch of as many pairs as the corpora hold
    sampling_temperature: float = 0.0
    # several validation pairs, each {name, src, tgt, src_lang, tgt_lang}; replaces valid_src/valid_tgt
    valid: list[ValidSetConfig] = field(default_factory=list)
    filters: FiltersConfig = field(default_factory=FiltersConfig)  # cleaning rules applied when corpora are encoded
    max_len: int = 256  # training pairs with more tokens than this on either side are dropped
    max_len_ratio: float = 3.0  # pairs whose longer side has more than this times the tokens of the shorter are dropped
    min_len_for_ratio: int = 5  # the ratio filter applies only when the longer side has at least this many tokens
    cache_dir: str = ""  # where encoded corpora are cached; empty = <train.out_dir>/cache
    # subword regularisation: training pairs re-segmented by sampling every epoch; 0 = off;
    # unigram: smoothing alpha (0.1-0.5, lower = more varied), bpe: BPE-dropout rate (~0.1)
    subword_alpha: float = 0.0
    subword_nbest: int = -1  # unigram sampling among the n best segmentations; -1 = all of them


@dataclass
class TokenizerConfig:
    """The sentencepiece model(s): reuse existing ones or train them at the start of `tmt train`."""

    model: str = ""  # joint (or source) .model file; empty = train one into <train.out_dir>
    tgt_model: str = ""  # target .model when joint is false; empty = train one
    joint: bool = True  # one vocabulary for both languages (needed for model.share_all_embeddings)
    model_type: str = "unigram"  # sentencepiece algorithm: unigram or bpe
    vocab_size: int = 8000  # pieces per model, special symbols included
    character_coverage: float = 1.0  # share of characters covered; 0.9995 suits large alphabets
    input_sentence_size: int = 2_000_000  # sentences sampled for training the tokenizer (0 = all)


@dataclass
class ModelConfig:
    """Transformer sizes (Table 3 of the paper); the defaults are the base model."""

    encoder_layers: int = 6  # N for the encoder
    decoder_layers: int = 6  # N for the decoder
    d_model: int = 512  # width of embeddings and every residual stream
    heads: int = 8  # h, attention heads per layer
    head_dim: int = 0  # d_k, query/key size per head; 0 = d_model / heads (Table 3 row B changes it)
    value_dim: int = 0  # d_v, value size per head; 0 = d_model / heads
    d_ff: int = 2048  # inner size of the position-wise feed-forward network
    dropout: float = 0.1  # P_drop on sublayer outputs and on embeddings + positions
    attention_dropout: float = 0.0  # dropout on attention weights (0 in the paper)
    activation_dropout: float = 0.0  # dropout after the FFN activation (0 in the paper)
    activation: str = "relu"  # FFN activation: relu, gelu or swish (SiLU, x * sigmoid(x))
    norm: str = "post"  # post = LayerNorm(x + sublayer(x)) (paper); pre = x + sublayer(LayerNorm(x));
    # scale = pre placement with ScaleNorm g * x / ||x|| and FixNorm embeddings (Nguyen & Salazar 2019)
    positions: str = "sinusoidal"  # sinusoidal (paper) or learned (Table 3 row E)
    # sinusoid order: interleaved (paper: sin even dims, cos odd), halves (all sines, then cosines) or fairseq (halves
    # with the frequencies 10000^(-i / (d/2 - 1)): fairseq's, M2M100's and NLLB's table)
    position_layout: str = "interleaved"
    position_offset: int = 0  # the position number of a sequence's first token (M2M100 / NLLB: 2, fairseq's pad + 1)
    max_positions: int = 1024  # longest sequence the model accepts (size of the learned table)
    share_all_embeddings: bool = True  # one matrix for source, target and output (needs a joint vocabulary)
    share_decoder_embeddings: bool = True  # tie target embedding and output projection
    output_bias: bool = False  # a bias vector (zero at start) added to the output layer's logits
    restrict_output: bool = (
        False  # output layer over the pieces seen on the training target side only (faster with a joint vocabulary)
    )
    # the special ids of the vocabulary (text.specials); tmt's own sentencepiece models use the defaults,
    # an imported vocabulary its own (MarianMT: eos 0, unk 1, pad last, no bos, the decoder starting from pad)
    pad_id: int = 0  # fills batches; masked out of attention and the loss
    unk_id: int = 1  # pieces outside the vocabulary
    bos_id: int = 2  # beginning of sentence; -1 = the vocabulary has none
    eos_id: int = 3  # ends every source and target sequence
    decoder_start_id: int = -1  # the decoder's first input; -1 = bos_id
    # NLLB / M2M100's target languages, space-separated (eng_Latn deu_Latn ...): each is a piece of the target
    # vocabulary, and the decoder's input starts [start, that piece] for that target language; empty: no such prefix
    decoder_languages: str = ""

    @property
    def start_id(self) -> int:
        """The id the decoder starts from: decoder_start_id, or bos_id when that is -1."""
        return self.bos_id if self.decoder_start_id == -1 else self.decoder_start_id


LORA_TARGETS = ("q", "k", "v", "o", "ffn1", "ffn2")  # the projections train.lora.targets may name


@dataclass
class LoraConfig:
    """Low-rank adapters (LoRA, Hu et al. 2021) as ``train.lora``: each chosen projection computes
    W x + (alpha / rank) B A x with W frozen and only A (rank, in) and B (out, rank) trained."""

    rank: int = 0  # r, the adapters' inner size; 0 = off (every weight trains, as train.freeze leaves it)
    alpha: float = 16.0  # the update is scaled by alpha / rank, so that a new rank needs no new learning rate
    dropout: float = 0.0  # dropout on the adapters' input (the base product sees the input undropped)
    # which projections get an adapter: q, k, v (attention's W^Q, W^K, W^V), o (W^O), ffn1, ffn2 (the feed-forward's
    # two products), in every attention of both stacks; a list or a comma string such as "q,v"
    targets: list[str] = field(default_factory=lambda: ["q", "v"])


@dataclass
class FreezeConfig:
    """Parts of the model that keep their weights while the rest trains (``train.freeze``; without LoRA)."""

    embeddings: bool = False  # the embedding tables, learned positions and the output projection (tied or not)
    encoder: bool = False  # every encoder layer and the encoder's final norm
    decoder: bool = False  # every decoder layer and the decoder's final norm
    encoder_layers: int = 0  # the first N encoder layers (those nearest the embeddings); 0 = none
    decoder_layers: int = 0  # the first N decoder layers; 0 = none


@dataclass
class TrainConfig:
    """The optimisation loop, its schedule, checkpoints and stopping rules."""

    out_dir: str = "runs/default"  # checkpoints, logs, metrics and the resolved config go here
    # fine-tuning: a checkpoint (tmt's or imported) whose weights, architecture (model.*) and tokenizer the run starts
    # from, with a fresh optimizer and schedule; empty = a model initialised from train.seed
    init_from: str = ""
    seed: int = 1  # seeds parameters, dropout and batch order
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps
    threads: int = 0  # CPU threads for torch; 0 = torch's default
    # who computes the operations with fast paths (transformer_mt.model.ops): auto (cpu on a CPU, cuda on a GPU),
    # reference (plain torch: F.linear, F.dropout, SDPA, logits then the loss; the numbers the others are tested
    # against), cpu or cuda
    ops: str = "auto"
    # float32, bfloat16 (autocast, CPU or CUDA), float16 (autocast + loss scaling, CUDA) or auto (per machine:
    # runtime.auto_dtype)
    dtype: str = "float32"
    max_tokens: int = 4096  # token budget per batch (the larger of source and target tokens, padding included)
    update_freq: int = 1  # batches whose gradients are accumulated into one update
    label_smoothing: float = 0.1  # eps_ls of section 5.4
    optimizer_betas: tuple[float, float] = (0.9, 0.98)  # Adam beta1, beta2 (section 5.3)
    optimizer_eps: float = 1e-9  # Adam epsilon (section 5.3)
    weight_decay: float = 0.0  # decoupled weight decay (AdamW); 0 = plain Adam as in the paper
    # noam: d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) * lr_scale; inverse_sqrt: peaks at lr;
    # linear: peaks at lr, decays to 0 at max_updates; wsd: warm-up, stable at lr, then a linear cool-down to 0 over
    # the last `cooldown` fraction of the budget (of max_time when it is set, so a timed run ends cool on any machine)
    lr_schedule: str = "noam"
    lr: float = 5e-4  # peak learning rate of the inverse_sqrt schedule
    lr_scale: float = 1.0  # multiplier of the paper's noam formula
    warmup_updates: int = 4000  # warmup_steps of section 5.3
    cooldown: float = 0.2  # wsd: fraction of the budget (max_time if set, else max_updates) spent cooling down
    ema_decay: float = (
        0.0  # exponential moving average of the weights (e.g. 0.999), used for validation and decoding; 0 = off
    )
    clip_norm: float = 0.0  # clip the gradient norm to this; 0 = no clipping
    max_updates: int = 0  # stop after this many updates; 0 = no limit
    max_epochs: int = 0  # stop after this many epochs; 0 = no limit
    max_time: float = 0.0  # stop after this many minutes of training; 0 = no limit
    validate_every: int = 1000  # updates between validations (and checkpoint saves)
    save_every: int = 0  # updates between numbered checkpoints kept on disk (validated or not); 0 = at every validation
    keep_last: int = 5  # numbered checkpoints kept (the newest ones); 0 = keep all
    # also keep, past keep_last, every numbered checkpoint whose update is a multiple of this (for
    # `tmt average --every`); 0 = none
    keep_every: int = 0
    best_metric: str = "bleu"  # bleu (higher is better) or loss (lower is better) picks checkpoint_best.pt
    patience: int = 0  # stop after this many validations without improvement; 0 = never
    valid_bleu_sentences: int = 0  # sentences of the validation set decoded for BLEU; 0 = all, -1 = skip BLEU
    valid_beam: int = 1  # beam size for validation BLEU (1 = greedy, fastest); lenpen from decode.lenpen
    log_every: int = 100  # updates between lines of the log and metrics file
    # also write the metrics.jsonl scalars as TensorBoard events in <out_dir>/tensorboard
    # (pip install -e ".[tensorboard]")
    tensorboard: bool = False
    # the device's matmul peak, for the MFU of the end-of-training cost report; 0 = measure once, cached in
    # ~/.cache/tmt/peak.json
    peak_tflops: float = 0.0
    # torch.compile of the layer stacks and the loss: auto (on with the cuda backend on a CUDA device, else off), on
    # (inductor), aot_eager (tracing without code generation: tests) or off
    compile: str = "auto"
    # inductor's mode when compiling: default, max-autotune-no-cudagraphs (searched kernels), max-autotune (and CUDA
    # graphs), reduce-overhead (CUDA graphs)
    compile_mode: str = "default"
    pad_to_multiple: int = 0  # sequence lengths padded up to a multiple of this (fewer shapes to compile); 0 = auto
    packed: str = "auto"  # variable-length packed batches, no compute on padding: auto (with the cuda backend), on, off
    lora: LoraConfig = field(default_factory=LoraConfig)  # low-rank adapters; rank 0 = off (full fine-tuning)
    freeze: FreezeConfig = field(default_factory=FreezeConfig)  # parts kept as they are while the rest trains

    @property
    def numbered_spacing(self) -> int:
        """Updates between numbered checkpoints: save_every, else validate_every (one at every validation)."""
        return self.save_every or self.validate_every

    def writes_numbered(self, update: int, *, validating: bool) -> bool:
        """Whether `update` writes checkpoint_<update>.pt: at multiples of save_every, or at every validation
        (the final one too, whatever its update) when save_every is 0."""
        return update % self.save_every == 0 if self.save_every else validating


@dataclass
class DecodeConfig:
    """Search settings used by `tmt translate`, `tmt evaluate` and validation BLEU."""

    beam: int = 4  # beam size (section 6.1); 1 = greedy
    lenpen: float = 0.6  # alpha of the GNMT length penalty ((5 + len) / 6) ** alpha
    max_len_a: float = 1.0  # max output length = a * source length + b
    max_len_b: int = 50  # (paper: input length + 50)
    batch_tokens: int = 4096  # source tokens per decoding batch
    nbest: int = 1  # hypotheses printed per input (with sample: independent samples per input)
    # Sampling instead of search (tmt translate --sample, load().translate(sample=True); tmt evaluate and validation
    # keep searching): each token drawn from softmax(logits / temperature), cut by top_k, then top_p, then epsilon
    # (each measured on what the one before left, renormalised; the most probable always stays), renormalised.
    sample: bool = False  # tmt translate draws samples by default (decode.beam is then not used)
    temperature: float = 1.0  # the logits are divided by it; 1 samples the model's own distribution
    top_k: int = 0  # only the k most probable tokens (0: no cut)
    top_p: float = 1.0  # only the nucleus: the fewest most probable tokens whose probability reaches top_p (1: no cut)
    epsilon: float = 0.0  # only tokens of probability at least epsilon (Hewitt et al., 2022; 0: no cut)
    seed: int = 0  # with each input line's number, seeds that line's samples (any batch size, any order)


@dataclass
class Config:
    """A whole experiment."""

    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
