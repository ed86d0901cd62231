"""The `roofline` flags: the parser, the accepted values of each flag, and which flags were typed.

Every value is checked by its argparse type, so a bad one is refused before anything runs, in one
line that names the flag, the value and what is accepted.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Sequence

from estimator.physics.offload import DEFAULT_UBATCH_TOKENS
from estimator.planning.spec import MAX_DEVICES as MAX_PLAN_DEVICES
from estimator.specs.hardware import DeviceClass

EXIT_INVALID = 2
MAX_COUNT = 10**9         # tokens, sequences, requests: far beyond any deployment
MAX_DEVICES = 65_536
MAX_SEARCH = 128          # the disaggregation search is quadratic in its largest deployment
MAX_NAME = 4096           # characters in a name or path (PATH_MAX on Linux)
MAX_NUMBER = 1e12
MIN_RATE, MAX_RATE = 1e-6, 1e9   # requests/s: one a fortnight to a billion a second


class _Parser(argparse.ArgumentParser):
    """An invalid flag is one line naming it, not the whole usage."""

    def error(self, message: str):
        # a flag with an alias (--rate, --request-rate) is named by its main spelling
        message = re.sub(r"argument (--[\w-]+)(?:/--[\w-]+)+:", r"argument \1:", message)
        self.exit(EXIT_INVALID, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _quoted(text: str) -> str:
    return repr(text) if len(text) <= 60 else f"{text[:40]!r}... ({len(text):,} characters)"


def _whole(low: int = 1, high: int = MAX_COUNT):
    """An argparse type: a whole number from ``low`` to ``high``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low:,} to {high:,}, got {_quoted(text)}")
        return value
    return parse


def _number(low: float = 0.0, high: float = MAX_NUMBER, above: bool = False):
    """An argparse type: a finite number from ``low`` (or above it) to ``high``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (value > low if above else value >= low) and value <= high):
            bound = f"above {low:g} and up to {high:g}" if above else f"from {low:g} to {high:g}"
            raise argparse.ArgumentTypeError(f"expected a number {bound}, got {_quoted(text)}")
        return value
    return parse


def _name(text: str) -> str:
    """An argparse type: a name or path, one line of printable characters."""
    if not text.strip() or len(text) > MAX_NAME or any(ch < " " or ch == "\x7f" for ch in text):
        raise argparse.ArgumentTypeError(f"expected a name or path of 1 to {MAX_NAME:,} printable characters, "
                                         f"got {_quoted(text)}")
    return text


def _names(text: str) -> list[str]:
    """An argparse type: comma-separated names."""
    names = [_name(x.strip()) for x in text.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {_quoted(text)}")
    return names


def _price(text: str) -> tuple[str, float]:
    """An argparse type: DEVICE=USD with a positive price."""
    name, _, value = text.rpartition("=")
    try:
        return _name(name.strip()), _number(above=True)(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected DEVICE=USD with USD above 0, e.g. 'NVIDIA H100 SXM=2.99', "
                                         f"got {_quoted(text)}") from None


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", action="append", default=[], metavar="PATH", type=_name,
                   help="folder of extra hardware/model YAML entries (repeatable; also $ROOFLINE_DB_PATH)")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="print the traceback of an unexpected error")


def _add_estimate_args(p: argparse.ArgumentParser) -> None:
    """The configuration flags `estimate`, `explain` and `speculation` share."""
    p.add_argument("--model", required=True, type=_name, help="name, alias, HF id, or path to a config.json")
    p.add_argument("--gpu", required=True, type=_name, help="name, alias or NVML name (see `roofline list gpus`)")
    p.add_argument("--memory-gib", type=_number(above=True), metavar="GIB",
                   help="memory size of a device sold with several (Apple chips; `roofline show gpu NAME` lists "
                        "them); default the largest. Elsewhere only the one size recorded is accepted")
    p.add_argument("--gpus", type=_whole(1, MAX_DEVICES),
                   help="devices in all (default tp x pp); beyond one replica: data parallel")
    p.add_argument("--tp", type=_whole(1, MAX_DEVICES),
                   help="tensor-parallel ranks per replica (default: all --gpus / pp)")
    p.add_argument("--pp", type=_whole(1, MAX_DEVICES), default=1, help="pipeline stages per replica (default 1)")
    p.add_argument("--ep", type=_whole(1, MAX_DEVICES), default=1,
                   help="expert-parallel ranks within the TP group, MoE only (default 1)")
    p.add_argument("--attention-dp", action="store_true",
                   help="attention data-parallel over the tp ranks (SGLang --enable-dp-attention, TensorRT-LLM "
                        "enable_attention_dp; with --ep: 'DEP'): whole attention weights and KV per rank")
    p.add_argument("--devices-per-node", type=_whole(1, MAX_DEVICES),
                   help="devices on one scale-up link (NVLink domain); beyond it the network is used (default: "
                        "the device's own, 72 for an NVL72 rack, else 8)")
    p.add_argument("--network-gbps", type=_number(1e-3, 1e6), default=400.0,
                   help="scale-out network per device between nodes, Gbit/s one way (default 400: InfiniBand NDR)")
    p.add_argument("--format", type=_name, help="weight format (default: what a GGUF or safetensors --model stores, "
                                               "else bf16; `roofline list formats`)")
    p.add_argument("--kv-format", default="f16", type=_name,
                   help="KV-cache format: f16, bf16, fp8, int8, q4 (default f16)")
    p.add_argument("--batch", type=_whole(), default=1, help="concurrent sequences (default 1)")
    p.add_argument("--prompt", type=_whole(), default=512, help="prompt tokens per sequence (default 512)")
    p.add_argument("--output", type=_whole(), default=256, help="generated tokens per sequence (default 256)")
    p.add_argument("--attention", choices=("fused", "unfused"), default="fused",
                   help="fused (FlashAttention-style, default) or unfused attention that writes the score matrix")
    p.add_argument("--kv-alloc", choices=("paged", "contiguous"), default="paged",
                   help="paged KV blocks (default) or contiguous per-request reservation")
    p.add_argument("--kv-block", type=_whole(), default=16, help="tokens per paged KV block (default 16)")
    p.add_argument("--prefix-tokens", type=_whole(0), default=0,
                   help="prompt prefix shared by all requests (e.g. a system prompt), cached once (default 0)")
    p.add_argument("--offload", choices=("none", "auto"), default="none",
                   help="auto: weights that do not fit stream from host memory over PCIe/NVLink-C2C (default none)")
    p.add_argument("--gpu-layers", type=_whole(1), help="llama.cpp-style partial offload: N >= 1 layers on the GPU, "
                                                        "the rest computed by the host CPU (--host-cpu); for none, "
                                                        "estimate the CPU itself (--gpu CPU)")
    experts = p.add_mutually_exclusive_group()
    experts.add_argument("--cpu-moe", action="store_true",
                         help="llama.cpp --cpu-moe: every MoE layer's routed experts in host memory, run by the host "
                              "CPU (--host-cpu); attention and dense layers stay on the GPU")
    experts.add_argument("--n-cpu-moe", type=_whole(1), metavar="N",
                         help="llama.cpp --n-cpu-moe N: the routed experts of the first N MoE layers on the host CPU")
    p.add_argument("--ubatch-size", type=_whole(1), default=DEFAULT_UBATCH_TOKENS, metavar="N",
                   help="llama.cpp -ub: prompts run in micro-batches of N tokens, which size the prompt workspace "
                        "and the passes over a MoE prompt's experts (default 512)")
    p.add_argument("--host-cpu", default="AMD Ryzen 9 7950X", type=_name,
                   help="host CPU for --gpu-layers (default 7950X)")
    p.add_argument("--draft-model", type=_name, help="speculative decoding: draft model (name, alias or config.json)")
    p.add_argument("--draft-tokens", type=_whole(0, 64), default=0,
                   help="speculative decoding: tokens drafted per step, γ")
    p.add_argument("--acceptance", type=_number(0, 1), default=0.7,
                   help="per-token draft acceptance rate α (default 0.7)")
    p.add_argument("--draft-cost", type=_number(0, 1), default=0.0,
                   help="without --draft-model: draft cost as a fraction of a target step (EAGLE ~0.05)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=_whole(), default=0,
                      help="steady state with C requests in flight (continuous batching; replaces --batch)")
    load.add_argument("--rate", "--request-rate", type=_number(MIN_RATE, MAX_RATE), default=0.0,
                      help="steady state at R requests/s arriving (open loop)")
    p.add_argument("--chunked-prefill", type=_whole(), default=0, metavar="TOKENS",
                   help="under load: mix prompt chunks into decode steps within this token budget per step")
    p.add_argument("--num-requests", type=_whole(), metavar="N",
                   help="N requests sent at once (an offline run; vllm bench serve --num-prompts without a "
                        "rate; replaces --batch): mean TTFT, TPOT and the run's throughput; with --rate, a finite "
                        "benchmark that, offered more than the engine serves, runs at capacity while its backlog "
                        "grows; with --concurrency C, N requests through C clients (--max-concurrency), the first "
                        "C sent at once")
    p.add_argument("--max-num-seqs", type=_whole(), metavar="N",
                   help="under load or with --num-requests: the scheduler runs at most N sequences at once, the "
                        "rest wait (vLLM --max-num-seqs; default: the engine profile's, e.g. vLLM 1024 on 70+ GiB "
                        "cards, else 256)")
    p.add_argument("--lengths", type=_name, metavar="PRESET|FILE.csv",
                   help="under load or with --num-requests: request lengths from a preset (chat, sharegpt, "
                        "sharegpt-bench: what vllm bench serve draws, rag, reasoning; random, random-r0.8: SGLang "
                        "bench_serving's uniform random dataset at range ratio 0 or the one named), a preset at "
                        "other means (sharegpt@229/217: its shape, those mean prompt and output tokens) or a CSV with "
                        "columns "
                        "prompt,output, one request per row; replaces --prompt and --output")
    p.add_argument("--kv-offload", choices=("none", "cpu", "disk"), default="none",
                   help="with --prefix-hit-rate: a second KV tier for cached prefixes (LMCache-style), host memory "
                        "or an NVMe drive; hits found there are copied back before prefill")
    p.add_argument("--kv-offload-gib", type=_number(0, 1e6), default=0.0, metavar="GIB",
                   help="the second tier's size per replica, GiB")
    p.add_argument("--expert-skew", type=_number(0, 10), default=0.0, metavar="S",
                   help="MoE routing skew: Zipf exponent of expert popularity (0: uniform, default; ~1: a few hot "
                        "experts); fewer experts read per step, and under --ep the busiest rank sets the step")
    p.add_argument("--prefix-hit-rate", type=_number(0, 1), default=0.0, metavar="H",
                   help="share of prompt tokens found in the engine's prefix cache (0-1): they skip prefill "
                        "(default 0)")
    p.add_argument("--prefill-gpus", type=_whole(1, MAX_DEVICES),
                   help="with --rate: disaggregated serving, X devices prefilling ...")
    p.add_argument("--decode-gpus", type=_whole(1, MAX_DEVICES),
                   help="... and Y devices decoding; compared with aggregated on X + Y")
    p.add_argument("--max-ttft-s", type=_number(above=True),
                   help="with --prefill-gpus: TTFT target for the fewest-devices search")
    p.add_argument("--max-itl-s", type=_number(above=True), help="with --prefill-gpus: inter-token latency target")
    p.add_argument("--max-gpus", type=_whole(1, MAX_SEARCH), default=64,
                   help="with --prefill-gpus and a target: largest deployment the search tries (default 64)")
    p.add_argument("--engine", default="generic", type=_name,
                   help="serving engine profile: llama.cpp, vLLM, SGLang, TensorRT-LLM, transformers, MLX, "
                        "ExLlamaV2, gpt-fast, pytorch-eager (the decoder `validate --local` times) or generic "
                        "(default); NAME@BACKEND (llama.cpp@vulkan), NAME@RELEASE (vLLM@0.7.3) or NAME@RUNTIME "
                        "(TensorRT-LLM@tensorrt)")
    p.add_argument("--calibration", default="auto", type=_name,
                   help="calibration profile (YAML from `roofline calibrate`); 'auto' (default) uses the newest "
                        "profile of this device in the calibration folder, 'none' the datasheet defaults")
    p.add_argument("--json", action="store_true", help="print one JSON object (base units: s, bytes)")
    _add_common(p)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="roofline", description="How fast will this LLM run on that GPU? Roofline estimates of TTFT, "
                                     "decode tokens/s and memory fit.")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an unexpected error")
    sub = parser.add_subparsers(dest="command", required=True)

    _add_estimate_args(sub.add_parser("estimate", help="estimate one configuration"))
    _add_estimate_args(sub.add_parser(
        "explain", help="why a configuration runs at that speed, and the changes that would help most"))

    spec = sub.add_parser("speculation", help="speculative-decoding speed-up over acceptance rate and draft length")
    _add_estimate_args(spec)
    spec.add_argument("--out", type=_name,
                      help="write the plot to this PNG file (never over an existing file without --force)")
    spec.add_argument("--force", action="store_true", help="overwrite --out if it exists")

    cal = sub.add_parser("calibrate", help="measure this machine's device and write a calibration profile")
    cal.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"), help="cuda, cpu or mps (default cpu)")
    mode = cal.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick", help="well under a minute (default)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full", help="a few minutes, more sizes")
    mode.add_argument("--smoke", dest="mode", action="store_const", const="smoke",
                      help="the smallest plan, a few seconds: checks the setup, not for estimates")
    cal.add_argument("--model", action="append", type=_name,
                     help="also time this dense model's own decode matrices (repeatable): its estimates then read "
                          "its own decode curve instead of the calibration shape's")
    cal.add_argument("--out", type=_name, help="profile path (default: the calibration folder, named after the device)")
    cal.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    cal.add_argument("--compare", nargs=2, type=_name, metavar=("A.yaml", "B.yaml"),
                     help="compare two profiles instead")
    _add_common(cal)

    pl = sub.add_parser("plan", help="which hardware, how many, in which format, at what cost (or a plan.yaml)")
    pl.add_argument("plan_file", nargs="?", type=_name,
                    help="a plan YAML (keys mirror the flags); with a file, give no plan flags")
    pl.add_argument("--model", action="append", type=_name, help="model(s) to plan for (repeatable)")
    pl.add_argument("--prompt", type=_whole(), help="prompt tokens per request")
    pl.add_argument("--output", type=_whole(), help="output tokens per request")
    load = pl.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=_whole(), help="requests in flight")
    load.add_argument("--rate", "--request-rate", type=_number(MIN_RATE, MAX_RATE), help="requests per second")
    pl.add_argument("--lengths", type=_name, metavar="PRESET|FILE.csv",
                    help="instead of --prompt/--output: request lengths served together, from a preset (chat, "
                         "sharegpt, rag, reasoning, random), one at other means (sharegpt@229/217) or a CSV of "
                         "prompt,output per request")
    pl.add_argument("--max-num-seqs", type=_whole(), metavar="N",
                    help="the engine runs at most N sequences at once (default: the engine profile's)")
    pl.add_argument("--prefix-hit-rate", type=_number(0, 1), metavar="H",
                    help="share of prompt tokens found in the engine's prefix cache (0-1, default 0)")
    pl.add_argument("--max-ttft-s", type=_number(above=True), help="TTFT target, seconds, queueing included")
    pl.add_argument("--min-tps-per-user", type=_number(above=True), help="decode tokens/s per user target")
    pl.add_argument("--percentile", choices=("p50", "p90"),
                    help="p90: judge the pessimistic end of each estimate's 80%% interval (default p50)")
    pl.add_argument("--latency-percentile", choices=("p50", "p90", "p99"),
                    help="judge the TTFT target on TTFT pXX and the per-user target on 1 / ITL pXX of the queueing "
                         "model under --concurrency or --rate (default: the mean latencies)")
    fmts = pl.add_mutually_exclusive_group()
    fmts.add_argument("--formats", type=_names,
                      help="comma-separated weight formats to consider (default bf16,fp8,int4-awq,nvfp4)")
    fmts.add_argument("--min-bits", type=_number(0, 32, above=True),
                      help="only formats with at least this many bits per weight")
    pl.add_argument("--gpus", type=_names, help="comma-separated devices or classes (datacenter_gpu, consumer_gpu ...)")
    pl.add_argument("--max-gpus", type=_whole(1, MAX_PLAN_DEVICES), help="largest deployment to consider (default 8)")
    pl.add_argument("--on-prem", action="store_true", help="purchase + power instead of cloud hourly prices")
    pl.add_argument("--budget", type=_number(above=True), help="USD: purchase (on-prem) or per month (cloud)")
    pl.add_argument("--engine", type=_name, help="serving-engine profile (default vLLM)")
    pl.add_argument("--price", action="append", default=[], type=_price, metavar="DEVICE=USD",
                    help="override a price: USD per device-hour (cloud) or purchase USD (--on-prem); repeatable")
    pl.add_argument("--devices-per-node", type=_whole(1, MAX_PLAN_DEVICES),
                    help="devices per node / NVLink domain (default 8)")
    pl.add_argument("--json", action="store_true")
    _add_common(pl)

    rep = sub.add_parser("report", help="a self-contained procurement report (HTML, Markdown or PDF) from a plan")
    rep.add_argument("plan_file", type=_name, help="plan YAML (see `roofline plan`)")
    rep.add_argument("--out", required=True, type=_name, help="output file")
    rep.add_argument("--format", choices=("html", "md", "pdf"), default="html")
    rep.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    _add_common(rep)

    val = sub.add_parser("validate", help="the estimator's error against published measurements (or this machine)")
    source = val.add_mutually_exclusive_group(required=True)
    source.add_argument("--published", action="store_true", help="leave-one-source-out error on measurements_db")
    source.add_argument("--local", action="store_true", help="measure a real model on this machine and compare")
    val.add_argument("--write", metavar="ENGINES_DIR", type=_name,
                     help="--published: rewrite the fitted engine parameters and intervals in this engines_db folder "
                          "(needs --force)")
    val.add_argument("--plot", type=_name, help="--published: write the predicted-vs-measured scatter to this PNG")
    val.add_argument("--jobs", type=_whole(1, 1024), help="--published: worker processes for the folds and fits "
                                                         "(default: one per core; the figures do not depend on it)")
    val.add_argument("--no-cache", action="store_true",
                     help="--published: recompute even where a result of the same data, code and library versions "
                          "is kept ($ROOFLINE_CACHE_DIR, default ~/.cache/llm-roofline)")
    val.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"),
                     help="--local: cpu, cuda or mps (default cpu)")
    val.add_argument("--model", action="append", type=_name, help="--local: model(s) to build (default: a small one)")
    val.add_argument("--quick", action="store_true", help="--local: one small model, few sizes (CI)")
    val.add_argument("--batch", action="append", type=_whole(1, 4096), help="--local: batch size (repeatable)")
    val.add_argument("--prompt", action="append", type=_whole(1, 1 << 20), help="--local: prompt tokens (repeatable)")
    val.add_argument("--output", type=_whole(2, 1 << 16), help="--local: generated tokens per run")
    val.add_argument("--calibration", type=_name, help="--local: a calibration profile file to use (default: the "
                                                      "newest of this device, else a quick measurement)")
    val.add_argument("--force", action="store_true", help="overwrite --plot, or the engine files of --write")
    val.add_argument("--json", action="store_true")
    _add_common(val)

    lst = sub.add_parser("list", help="list gpus, models or formats")
    lst.add_argument("what", choices=("gpus", "models", "formats"))
    lst.add_argument("--vendor", type=_name, help="gpus: only this vendor (e.g. NVIDIA, AMD, Apple)")
    lst.add_argument("--class", dest="device_class", choices=[c.value for c in DeviceClass],
                     help="gpus: only this device class")
    lst.add_argument("--family", type=_name, help="models: only this family (e.g. llama, qwen)")
    lst.add_argument("--min-memory-gib", type=_number(), help="gpus: at least this much memory")
    lst.add_argument("--moe", action="store_true", help="models: only mixture-of-experts models")
    lst.add_argument("--json", action="store_true")
    _add_common(lst)

    show = sub.add_parser("show", help="every field of a gpu or model, with its source")
    show.add_argument("what", choices=("gpu", "model"))
    show.add_argument("name", type=_name)
    show.add_argument("--json", action="store_true")
    _add_common(show)

    chk = sub.add_parser("check", help="validate the databases (built-in and --db) and compare parameter counts")
    _add_common(chk)

    pred = sub.add_parser("predict", help="predict each configuration of a CSV")
    pred.add_argument("--csv", required=True, type=_name, help="input CSV (id, framework, hardware, n_gpus, model, "
                                                               "weight_format, kv_format, batch, input_len, "
                                                               "output_len, metric[, value, unit])")
    pred.add_argument("--out", required=True, type=_name,
                      help="output CSV (id, status, predicted, measured, rel_error, reason)")
    pred.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    _add_common(pred)
    return parser


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The parsed command line; ``given`` maps each option typed to its flag. Exits (2) on a bad flag."""
    args = build_parser().parse_args(argv)
    args.given = given_options(argv)
    return args


def given_options(argv: Sequence[str]) -> dict[str, str]:
    """The options typed on the command line, by destination, with their flags (defaults hide which were typed)."""
    parser = build_parser()
    flags: dict[str, list[str]] = {}
    for p in _parsers(parser):
        for action in p._actions:
            action.default = argparse.SUPPRESS
            if action.option_strings:
                flags.setdefault(action.dest, []).append(action.option_strings[0])
    return {dest: "/".join(dict.fromkeys(flags.get(dest, [dest]))) for dest in vars(parser.parse_args(argv))}
