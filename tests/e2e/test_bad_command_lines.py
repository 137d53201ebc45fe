"""A table of bad command lines: each ends in one clear error line that names the file, the key, the line or the
option, and leaves every input as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from transformer_mt.cli import main

# ---------------------------------------------------------------- a table of bad command lines
# Each row: tmt's arguments and what the error must name (the file, the key, the line or the option).
# {ckpt}: a tiny checkpoint; {spm}: its sentencepiece model; {src}/{ref}: 100 val lines (en/de);
# {long_ref}: 2000 lines; {bad_utf8}: line 2 in latin-1; {cfg}: a valid training config; {tmp}: a scratch dir.
BAD_COMMANDS = [
    # tokenize
    ("tok-train-missing-input", "tokenize train -i {tmp}/missing.txt -o {tmp}/sp", "{tmp}/missing.txt"),
    ("tok-train-vocab-0", "tokenize train -i {src} -o {tmp}/sp --vocab-size 0", "'--vocab-size'"),
    (
        "tok-train-sentences-negative",
        "tokenize train -i {src} -o {tmp}/sp --input-sentence-size -1",
        "'--input-sentence-size'",
    ),
    ("tok-train-model-type", "tokenize train -i {src} -o {tmp}/sp --model-type word2", "'word2'"),
    ("tok-train-prefix-through-file", "tokenize train -i {src} -o {src}/sp", "{src}"),
    ("tok-train-invalid-utf8", "tokenize train -i {bad_utf8} -o {tmp}/sp", "{bad_utf8}:2"),
    ("tok-encode-missing-model", "tokenize encode -m {tmp}/missing.model {src}", "{tmp}/missing.model"),
    ("tok-encode-text-as-model", "tokenize encode -m {src} {src}", "{src}: not a sentencepiece model"),
    ("tok-encode-missing-input", "tokenize encode -m {spm} {tmp}/missing.txt", "{tmp}/missing.txt"),
    ("tok-encode-output-is-model", "tokenize encode -m {spm} {src} -o {spm}", "the output is the input file"),
    ("tok-encode-invalid-utf8", "tokenize encode -m {spm} {bad_utf8}", "{bad_utf8}:2"),
    ("tok-decode-not-ids", "tokenize decode -m {spm} --ids {src}", "{src}:1"),
    # train
    ("train-no-config", "train", "--config"),
    ("train-missing-config", "train -c {tmp}/missing.yaml", "{tmp}/missing.yaml"),
    ("train-config-not-a-mapping", "train -c {src}", "{src}"),
    ("train-unknown-key", "train -c {cfg} --set train.lrr=0.1", "train.lrr"),
    ("train-unknown-section", "train -c {cfg} --set trian.lr=0.1", "trian"),
    ("train-set-without-equals", "train -c {cfg} --set train.lr", "--set"),
    ("train-set-not-yaml", "train -c {cfg} --set train.optimizer_betas=[0.9,", "--set"),
    ("train-negative-lr", "train -c {cfg} --set train.lr=-1", "train.lr"),
    ("train-nan-lr", "train -c {cfg} --set train.lr=.nan", "train.lr"),
    ("train-string-for-int", "train -c {cfg} --set train.max_tokens=many", "train.max_tokens"),
    ("train-heads-not-dividing", "train -c {cfg} --set model.d_model=30 --set model.heads=4", "model.d_model"),
    ("train-huge-model", "train -c {cfg} --set model.d_model=10000000", "model.d_model"),
    ("train-dropout-one", "train -c {cfg} --set model.dropout=1.0", "model.dropout"),
    ("train-bad-choice", "train -c {cfg} --set model.norm=middle", "model.norm"),
    ("train-missing-train-file", "train -c {cfg} --set data.train_src={tmp}/missing.en", "data.train_src"),
    ("train-half-validation-pair", "train -c {cfg} --set data.valid_src={src}", "data.valid_tgt"),
    (
        "train-max-len-over-positions",
        "train -c {cfg} --set data.max_len=600 --set model.max_positions=512",
        "data.max_len",
    ),
    ("train-resume-nowhere", "train --resume {tmp}/no_run", "{tmp}/no_run"),
    ("train-out-dir-through-file", "train -c {cfg} --set train.out_dir={src}/run", "{src}"),
    ("train-duplicate-key", "train -c {dup_cfg}", "{dup_cfg}: line 3"),
    # translate
    ("tr-missing-checkpoint", "translate -c {tmp}/missing.pt {src}", "{tmp}/missing.pt"),
    ("tr-text-as-checkpoint", "translate -c {src} {src}", "{src}: not a transformer_mt checkpoint"),
    ("tr-directory-as-checkpoint", "translate -c {tmp} {src}", "{tmp}: is a directory"),
    ("tr-missing-input", "translate -c {ckpt} {tmp}/missing.en", "{tmp}/missing.en"),
    ("tr-beam-beyond-vocabulary", "translate -c {ckpt} {src} --beam 100000", "--beam 100000"),
    ("tr-beam-zero", "translate -c {ckpt} {src} --beam 0", "--beam 0"),
    ("tr-nbest-zero", "translate -c {ckpt} {src} --nbest 0", "--nbest 0"),
    ("tr-nbest-over-beam", "translate -c {ckpt} {src} --beam 2 --nbest 3", "--nbest 3"),
    ("tr-lenpen-nan", "translate -c {ckpt} {src} --lenpen nan", "--lenpen nan"),
    ("tr-batch-tokens-zero", "translate -c {ckpt} {src} --batch-tokens 0", "'--batch-tokens'"),
    ("tr-threads-negative", "translate -c {ckpt} {src} --threads -1", "'--threads'"),
    ("tr-beam-not-a-number", "translate -c {ckpt} {src} --beam wide", "'--beam'"),
    ("tr-device", "translate -c {ckpt} {src} --device gpu", "'gpu'"),
    ("tr-dtype", "translate -c {ckpt} {src} --dtype float8", "'float8'"),
    ("tr-output-is-input", "translate -c {ckpt} {src} -o {src}", "the output is the input file"),
    ("tr-output-through-file", "translate -c {ckpt} {src} -o {src}/out.de", "{src}"),
    ("tr-invalid-utf8", "translate -c {ckpt} {bad_utf8}", "{bad_utf8}:2"),
    # evaluate
    ("ev-missing-ref", "evaluate -c {ckpt} --src {src} --ref {tmp}/missing.de", "{tmp}/missing.de"),
    ("ev-ref-line-count", "evaluate -c {ckpt} --src {src} --ref {long_ref} -o {tmp}/hyp", "{long_ref} has 2000"),
    ("ev-beam-beyond-vocabulary", "evaluate -c {ckpt} --src {src} --ref {ref} --beam 100000", "--beam 100000"),
    ("ev-output-is-ref", "evaluate -c {ckpt} --src {src} --ref {ref} -o {ref}", "the output is the input file"),
    # bleu
    ("bleu-width-negative", "bleu -r {ref} {ref} -w -1", "'--width'"),
    ("bleu-width-huge", "bleu -r {ref} {ref} -w 1000000000", "'--width'"),
    ("bleu-missing-ref", "bleu -r {tmp}/missing.de {ref}", "{tmp}/missing.de"),
    ("bleu-tokenizer", "bleu -r {ref} {ref} -tok nope", "'nope'"),
    ("bleu-line-count", "bleu -r {long_ref} {ref}", "{long_ref} has 2000"),
    ("bleu-invalid-utf8", "bleu -r {ref} {bad_utf8}", "{bad_utf8}:2"),
    # average
    ("avg-one-checkpoint", "average {ckpt} -o {tmp}/avg.pt", "at least two checkpoints"),
    ("avg-run-without-numbered", "average --run {tmp} --last 2 -o {tmp}/avg.pt", "{tmp}"),
    ("avg-last-zero", "average --run {tmp} --last 0 -o {tmp}/avg.pt", "'--last'"),
    ("avg-text-as-checkpoint", "average {ckpt} {src} -o {tmp}/avg.pt", "{src}"),
    ("avg-output-is-input", "average {ckpt} {ckpt2} -o {ckpt2}", "the output is the input checkpoint"),
    ("avg-output-fifo", "average {ckpt} {ckpt2} -o {fifo}", "{fifo}: exists and is not a regular file"),
    # preprocess
    ("pre-missing-config", "preprocess -c {tmp}/missing.yaml", "{tmp}/missing.yaml"),
    ("pre-bad-value", "preprocess -c {cfg} --set data.max_len=0", "data.max_len"),
    # empty data: the line that says so stands alone (no data summary before it, no usage box)
    (
        "train-empty-train-file",
        "train -c {cfg} --set data.train_src={empty}",
        "{empty}: the training file holds no text",
    ),
    (
        "train-blank-train-file",
        "train -c {cfg} --set data.train_tgt={blank}",
        "{blank}: the training file holds no text",
    ),
    (
        "train-empty-validation",
        "train -c {cfg} --set data.valid_src={empty} --set data.valid_tgt={empty}",
        "{empty}: the validation file holds no text",
    ),
    (
        "pre-empty-train-file",
        "preprocess -c {cfg} --set data.train_src={empty}",
        "{empty}: the training file holds no text",
    ),
    ("unknown-command", "nope", "no such command 'nope'"),
    ("unknown-option", "bleu -r {ref} {ref} --nope", "no such option: --nope"),
    ("missing-option", "bleu {ref}", "missing option '--ref'"),
]


def test_the_table_is_large_enough():
    assert len(BAD_COMMANDS) >= 40 and len({name for name, _, _ in BAD_COMMANDS}) == len(BAD_COMMANDS)


@pytest.mark.parametrize("name, argv, names", BAD_COMMANDS, ids=[row[0] for row in BAD_COMMANDS])
def test_bad_command_line_is_one_clear_error(name, argv, names, bad_inputs, capsys):
    Path(bad_inputs["tmp"]).mkdir(exist_ok=True)
    before = {
        p: Path(p).read_bytes() for p in (bad_inputs["src"], bad_inputs["ref"], bad_inputs["ckpt2"], bad_inputs["spm"])
    }
    with pytest.raises(SystemExit) as exc:
        main([arg.format(**bad_inputs) for arg in argv.split()])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and "Traceback" not in err, err
    assert err.count("\n") == 1 and err.startswith("tmt: error: ") and not out, out + err  # the one line, alone
    assert names.format(**bad_inputs) in err, err
    assert {p: Path(p).read_bytes() for p in before} == before  # no input was touched
