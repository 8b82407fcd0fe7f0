"""`gptrain generate`: sample text from a run's newest complete checkpoint."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence


def add_generate_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `generate` (torch is imported only when it runs)."""
    parser = subparsers.add_parser(
        "generate",
        help="generate text from a trained checkpoint",
        description=(
            "Load the newest complete checkpoint of a run (CHECKPOINT: the run directory, its results/ "
            "or checkpoints/ directory, or one step_N dir), rebuild the model from the run's hparams.yaml, "
            "and continue PROMPT with its tokenizer. The model sees the last tokens of its context: "
            "model.max_position_embeddings for a rope model (an imported model's whole context), "
            "model.encoder_seq_length for a learned position table."
        ),
    )
    parser.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="a run directory (results/<run.name>), its results/ or checkpoints/ directory, or a step_<N> directory",
    )
    parser.add_argument(
        "--prompt",
        action="append",
        default=[],
        help=(
            "text to continue (may be repeated: one result per prompt, in order); an empty prompt, or one "
            "the tokenizer encodes to no tokens, is refused (as vLLM does, and Megatron's server without "
            "add_BOS)"
        ),
    )
    parser.add_argument(
        "--prompt-file",
        metavar="FILE",
        help="UTF-8 text file of prompts, one a line (empty lines skipped; after any --prompt; - reads stdin)",
    )
    parser.add_argument(
        "--jsonl",
        action="store_true",
        help=(
            'print one JSON line per prompt: {"prompt", "completion" (the text after the prompt), '
            '"finish_reason": "stop" (end token or --stop string) or "length" (--max-new-tokens)}'
        ),
    )
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate (default 64)")
    parser.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="softmax temperature (default 1.0; 0: greedy, as --greedy)",
    )
    parser.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="sample only from the k most likely tokens (0: off, 1: greedy, as in Megatron; default off)",
    )
    parser.add_argument(
        "--top-p",
        type=float,
        default=None,
        help="sample only from the most likely tokens whose probability adds up to p (nucleus; after --top-k; 0 or 1: off; default off)",
    )
    parser.add_argument(
        "--greedy",
        action="store_true",
        help=(
            "always take the most likely token (NeMo's greedy: True, Hugging Face's do_sample=False; "
            "--temperature 0 and --top-k 1 do the same)"
        ),
    )
    parser.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="STRING",
        help=(
            "stop once the text ends in STRING, and print the text before it (may be repeated: the first "
            "one reached ends it); it may start in the prompt (--stop $'\\nQ:' after a prompt ending in a "
            "newline) but must end in generated text, and the prompt is always printed whole; the "
            "end-of-document token, and each end token an imported model declares (its eos_token_id), "
            "always stops"
        ),
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=8,
        metavar="N",
        help=(
            "prompts generated together (default 8), in left-padded batches through the KV cache "
            "grouped by length: a batch closes before its cache would hold over twice the columns its "
            "prompts need alone (prompt + --max-new-tokens each), so a long prompt among short ones "
            "runs apart; each gets the tokens it gets alone up to rounding (a batch runs other kernel "
            "shapes, so in float32 or bf16 a near tie may break the other way); 1: one at a time, "
            "exactly as alone"
        ),
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=1234,
        help=(
            "sampling seed (default 1234); each prompt starts from it with a generator of its own, so its "
            "text does not depend on the others (up to --batch-size's rounding)"
        ),
    )
    parser.set_defaults(func=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    from gptrain.trained.load import load_run
    from gptrain.trained.sampling import check_sampling

    check_sampling(
        args.max_new_tokens, args.temperature, args.top_k, args.greedy, args.top_p
    )  # before loading
    prompts = read_prompts(args.prompt, args.prompt_file)
    check_stop_strings(args.stop)
    check_seed(args.seed)
    check_batch_size(args.batch_size)
    run = load_run(args.checkpoint)
    print(f"gptrain: loaded {run.checkpoint}", file=sys.stderr)
    ends = end_ids(run)
    excluded = undecodable_ids(run.tokenizer, run.vocab_size)
    prompt_ids = encode_prompts(run.tokenizer, prompts)
    labels = [f"prompt {number}: " if len(prompts) > 1 else "" for number in range(1, len(prompts) + 1)]
    for first in range(0, len(prompts), args.batch_size):
        batch = slice(first, first + args.batch_size)
        results = continue_prompts(
            run, prompts[batch], prompt_ids[batch], args, ends, excluded, labels[batch]
        )
        for prompt, (completion, finish_reason) in zip(prompts[batch], results, strict=True):
            if args.jsonl:
                result = {"prompt": prompt, "completion": completion, "finish_reason": finish_reason}
                print(json.dumps(result, ensure_ascii=False), flush=True)
            else:
                print(prompt + completion, flush=True)
    return 0


def check_batch_size(batch_size: int) -> None:
    from gptrain.errors import ConfigError

    if batch_size < 1:
        raise ConfigError(f"--batch-size={batch_size} must be at least 1 (1: one prompt at a time)")


def encode_prompts(tokenizer, prompts: list[str]) -> list[list[int]]:
    """Each prompt's ids; one the tokenizer encodes to nothing is refused before any text is
    generated (the model has no token to continue from)."""
    from gptrain.errors import ConfigError

    encoded = [list(tokenizer.encode(prompt)) for prompt in prompts]
    for number, (prompt, ids) in enumerate(zip(prompts, encoded, strict=True), 1):
        if not ids:
            raise ConfigError(
                f"prompt {number} ({prompt!r}) encodes to no tokens with this run's tokenizer; give text "
                "it keeps (an empty prompt is refused, as in vLLM)"
            )
    return encoded


def continue_prompts(
    run,
    prompts: list[str],
    prompt_ids: list[list[int]],
    args: argparse.Namespace,
    ends: set[int],
    excluded: list[int],
    labels: list[str],
) -> list[tuple[str, str]]:
    """For each prompt, the text generated after it (up to the first --stop string) and why it
    ended: "stop" (an end token or a stop string) or "length". The prompts run batched, each
    from --seed with a generator of its own, so its text does not depend on the others (up to a
    batch's rounding)."""
    import torch

    from gptrain.trained.sampling import Picker, generate_batch

    for ids, label in zip(prompt_ids, labels, strict=True):
        window_note = context_window_note(len(ids), args.max_new_tokens, run.model.config.seq_length)
        if window_note:
            print(window_note.replace("gptrain: note: ", f"gptrain: note: {label}", 1), file=sys.stderr)
    picker = Picker(args.temperature, args.top_k, args.top_p, args.greedy, run.vocab_size, excluded, ends)
    new_ids = generate_batch(
        run.model,
        prompt_ids,
        args.max_new_tokens,
        picker,
        generators=[torch.Generator().manual_seed(args.seed) for _ in prompts],
        stops=[
            stop_string_reached(run.tokenizer, prompt, ids, args.stop)
            for prompt, ids in zip(prompts, prompt_ids, strict=True)
        ],
    )
    return [
        completion_and_reason(run.tokenizer, prompt, ids, new, ends, args.stop)
        for prompt, ids, new in zip(prompts, prompt_ids, new_ids, strict=True)
    ]


def completion_and_reason(
    tokenizer, prompt: str, prompt_ids: list[int], new_ids: list[int], ends: set[int], stops: Sequence[str]
) -> tuple[str, str]:
    """The completion printed (without its end token, cut before a stop string) and its finish reason."""
    ended = bool(new_ids) and new_ids[-1] in ends
    if ended:
        new_ids = new_ids[:-1]
    text = continuation_text(tokenizer, prompt_ids, new_ids)
    completion = before_stop_string(prompt, text, stops)[len(prompt) :]
    return completion, "stop" if ended or completion != text else "length"


def read_prompts(prompts: Sequence[str], prompt_file: str | None) -> list[str]:
    """The --prompt texts, then --prompt-file's non-empty lines, each checked to be UTF-8 text."""
    from gptrain.errors import ConfigError

    for prompt in prompts:
        check_prompt_is_text(prompt)
        if not prompt:
            raise ConfigError("--prompt '': the prompt is empty; give some text to continue")
    found = list(prompts)
    if prompt_file is not None:
        found += prompt_file_lines(prompt_file)
    if not found:
        raise ConfigError(
            "no prompt: give --prompt TEXT (may be repeated) or --prompt-file FILE (one a line)"
        )
    return found


def prompt_file_lines(path: str) -> list[str]:
    """The non-empty lines of `path` (stdin for -), CRLF or LF; a byte that is not UTF-8 is named
    with its line, before the model loads."""
    from gptrain.errors import ConfigError, non_utf8

    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as file:
                data = file.read()
    except OSError as error:
        raise ConfigError(f"--prompt-file {path}: {error.strerror or error}") from None
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ConfigError(f"--prompt-file {path}: is UTF-16; convert it to UTF-8 (iconv -f utf-16 -t utf-8)")
    text = data.decode("utf-8-sig", errors="surrogateescape")  # a UTF-8 byte-order mark is no prompt text
    lines = []
    for number, line in enumerate(text.replace("\r\n", "\n").replace("\r", "\n").split("\n"), 1):
        if (bad := non_utf8(line)) is not None:
            raise ConfigError(
                f"--prompt-file {path}: line {number}: {bad[1]} (character {bad[0] + 1}) is not UTF-8; "
                "convert the file to UTF-8 (e.g. iconv -f latin1)"
            )
        if line:
            lines.append(line)
    if not lines:
        raise ConfigError(f"--prompt-file {path}: holds no prompt (one a line, empty lines are skipped)")
    return lines


def check_seed(seed: int) -> None:
    """A seed outside torch's generator range was a ValueError traceback after the model loaded."""
    from gptrain.errors import ConfigError

    if not -(2**63) <= seed < 2**64:
        raise ConfigError(f"--seed={seed} must be from -2**63 to 2**64 - 1 (what torch's generator takes)")


def end_ids(run) -> set[int]:
    """The ids that end a generation: the tokenizer's end-of-document token, when it names one (a
    bare tokenizer.json may not: generate refused such an import though its config.json gives
    eos_token_id), and an imported model's eos ids. Said on stderr when there are none."""
    from gptrain.errors import DataError

    try:
        ends = {run.tokenizer.eod, *run.end_ids}
    except DataError:
        ends = set(run.end_ids)
    if not ends:
        print(
            "gptrain: note: the tokenizer names no end-of-document token and the model no eos_token_id: "
            "generating --max-new-tokens tokens (or up to a --stop string)",
            file=sys.stderr,
        )
    return ends


def undecodable_ids(tokenizer, vocab_size: int) -> list[int]:
    """Ids below vocab_size that the tokenizer has no token for, which a model trained with it still
    scores. tiktoken's encodings leave gaps between their ordinary and special tokens (cl100k_base:
    100256 and 100261-100275): one sampled made the decode fail after the whole generation ('token
    id None is not in this tokenizer's vocabulary'). A tokenizer.json (or vocab.json) may number its
    tokens with gaps too: those ids decoded to nothing."""
    from gptrain.data.tokenizer_identity import token_table

    return [token_id for token_id, token in enumerate(token_table(tokenizer)[:vocab_size]) if token is None]


def check_stop_strings(stops: Sequence[str]) -> None:
    """An empty --stop would end generation before its first token; one that is not UTF-8 could
    never appear in decoded text."""
    from gptrain.errors import ConfigError, non_utf8

    for stop in stops:
        if not stop:
            raise ConfigError("--stop '': an empty stop string ends every generation at once; give some text")
        if (bad := non_utf8(stop)) is not None:
            raise ConfigError(
                f"--stop: {bad[1]} (character {bad[0] + 1}) is not UTF-8; give the stop string as UTF-8 text"
            )


def stop_string_reached(
    tokenizer, prompt: str, prompt_ids: list[int], stops: Sequence[str]
) -> Callable[[list[int]], bool] | None:
    """Whether the prompt and the text generated so far hold a stop string that ends in the
    generated part. Checked on the decoded text, not on token ids: a string can end inside a token,
    or span several (none without --stop)."""
    if not stops:
        return None

    def reached(new_ids: list[int]) -> bool:
        text = continuation_text(tokenizer, prompt_ids, new_ids)
        return stop_string_start(prompt + text, len(prompt), stops) is not None

    return reached


def stop_string_start(text: str, generated_from: int, stops: Sequence[str]) -> int | None:
    """Where the earliest stop string that ends past `generated_from` starts in `text` (None: none).

    A match may start in the prompt, as transformers' stop_strings match the end of the whole
    sequence: a few-shot prompt ending in a newline never stopped on --stop $'\\nQ:' when the model
    wrote "Q:" first. One that ends inside the prompt is the prompt's own, not a stop."""
    starts = [text.find(stop, max(0, generated_from - len(stop) + 1)) for stop in stops]
    return min((start for start in starts if start >= 0), default=None)


def before_stop_string(prompt: str, text: str, stops: Sequence[str]) -> str:
    """The prompt and `text` up to the earliest stop string that ends in `text` (all of it when
    none does); a match that starts in the prompt cuts no prompt text."""
    whole = prompt + text
    start = stop_string_start(whole, len(prompt), stops)
    return whole if start is None else whole[: max(start, len(prompt))]


def check_prompt_is_text(prompt: str) -> None:
    """A prompt from a terminal or file in another encoding (Latin-1) reaches Python with its bytes
    as surrogates, which no tokenizer takes: the HF tokenizer raised "TextInputSequence must be str"
    as a traceback, after the checkpoint was loaded."""
    from gptrain.errors import ConfigError, non_utf8

    if (bad := non_utf8(prompt)) is not None:
        position, what = bad
        raise ConfigError(
            f"--prompt: {what} (character {position + 1}) is not UTF-8; give the prompt as "
            "UTF-8 text (a terminal or file in another encoding: convert it, e.g. iconv -f latin1)"
        )


def context_window_note(prompt_tokens: int, max_new_tokens: int, seq_length: int) -> str | None:
    """The model sees its last seq_length tokens only: said when the prompt, or the prompt with the
    continuation, is longer, since the start of the prompt then no longer conditions what follows
    (nothing to say when nothing follows: --max-new-tokens 0)."""
    if max_new_tokens == 0:
        return None
    if prompt_tokens > seq_length:
        return (
            f"gptrain: note: the prompt is {prompt_tokens} tokens, longer than the model's context of "
            f"{seq_length}: only its last {seq_length} tokens condition the continuation"
        )
    if prompt_tokens + max_new_tokens > seq_length:
        return (
            f"gptrain: note: prompt ({prompt_tokens} tokens) + --max-new-tokens {max_new_tokens} exceed the "
            f"model's context of {seq_length}: past it, each token is conditioned on the last {seq_length} only"
        )
    return None


def continuation_text(tokenizer, prompt_ids: list[int], new_ids: list[int]) -> str:
    """The text the new tokens add after the prompt's.

    Decoded with the prompt, not alone: a SentencePiece-style tokenizer.json (Llama's, Mistral's)
    drops the space of a text's first word piece, so the new tokens decoded alone lost the space
    after the prompt ("Hello" + "world"). When the prompt's own decoding is not a prefix of the
    whole (a normalizer that rewrites it), the new tokens are decoded alone.
    """
    whole = tokenizer.decode([*prompt_ids, *new_ids])
    prompt = tokenizer.decode(prompt_ids)
    if whole.startswith(prompt):
        return whole[len(prompt) :]
    return tokenizer.decode(new_ids)
