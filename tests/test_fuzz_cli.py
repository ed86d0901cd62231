"""The command line under fuzzing: every flag of every subcommand, every kind of input file.

Hypothesis builds command lines from each flag's accepted values and from bad ones (0, -1, NaN,
inf, 1e30, text, empty, odd names, binary files, missing folders), and mutates valid input files
(a predict CSV, a plan YAML, a calibration profile, a config.json, a --db folder). Each case runs
in-process through ``estimator.cli.main`` and must keep the contract:

- it exits with 0 or 2; 3 (an unexpected error) is a bug, and so is any traceback;
- a value outside a flag's accepted range exits with 2;
- exit 2 prints one line on stderr, naming no Python exception class, and nothing on stdout;
- exit 0 prints no NaN or Infinity: JSON that a strict parser accepts, text without nan or inf;
- no input file is modified.

Slow commands (validate, calibrate, report) are fuzzed with invalid input only. Examples are
derandomized, so every run tries the same 417 cases (about 35 s on two cores).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import itertools
import json
import math
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from estimator.cli import main

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "hardware_db" / "calibrations" / "amd-epyc-2-vcpu-ci-machine.yaml"
NON_FINITE_TEXT = re.compile(r"(?<![\w.])[-+]?(?:nan|inf)(?!\w)", re.IGNORECASE)
CLASS_NAME = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b")
COUNTER = itertools.count()


def fuzz(examples: int):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


# ---------------------------------------------------------------- values of flags, each with its validity
# A piece is (tokens, valid): valid is True (the flag accepts it), False (it must be refused) or
# None (it depends on the rest of the command). "@name" tokens are files made by the `files` fixture.

JUNK = ["", " ", "nan", "NaN", "inf", "-inf", "1e30", "1e400", "text", "1,5", "0x10", "½", "--", "1.5", "9" * 40]
ODD_NAMES = ["", " ", "x" * 5000, "a\nb", "h100\x00", "../../etc/passwd", "💥", "-", "zz-no-such-thing"]


def _is_whole(text: str, low: int, high: int) -> bool:
    try:
        return low <= int(text) <= high
    except ValueError:
        return False


def _is_number(text: str, low: float, high: float, above: bool) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(value) and (value > low if above else value >= low) and value <= high


def mostly(valid, invalid):
    """Three valid values for every invalid one, so that most commands get far enough to print."""
    return st.sampled_from([valid] * 3 + [invalid]).flatmap(lambda strategy: strategy)


def whole(low: int, high: int, typical, wide: bool = True):
    valid = st.sampled_from([str(v) for v in typical])
    if wide:
        valid = st.one_of(valid, st.integers(min_value=low, max_value=high).map(str))
    invalid = st.one_of(st.sampled_from(JUNK + [str(low - 1), str(high + 1), "-1", "0"]),
                        st.integers(min_value=-10, max_value=2 * high).map(str))
    return mostly(valid, invalid).map(lambda t: ([t], _is_whole(t, low, high)))


def number(low: float, high: float, typical, above: bool = False):
    valid = st.one_of(st.sampled_from([repr(v) for v in typical]),
                      st.floats(min_value=low, max_value=high, exclude_min=above).map(repr))
    invalid = st.one_of(st.sampled_from(JUNK + ["-1", "0"]), st.floats(allow_nan=True, allow_infinity=True).map(repr))
    return mostly(valid, invalid).map(lambda t: ([t], _is_number(t, low, high, above)))


def names(valid, odd=True):
    valid = st.sampled_from(valid).map(lambda n: ([n], True))
    if not odd:
        return valid
    return mostly(valid, st.one_of(st.sampled_from(ODD_NAMES).map(lambda n: ([n], False)),
                                   st.text(min_size=1, max_size=12).map(lambda t: (["zz" + t], None))))


def choice(valid):
    return mostly(st.sampled_from(valid).map(lambda v: ([v], True)),
                  st.sampled_from(["", "x", valid[0].upper() + "!"]).map(lambda v: ([v], False)))


SWITCH = st.just(([], True))


def option(flag: str, values):
    return values.map(lambda piece: ([flag, *piece[0]], piece[1]))


def file_arg(valid, invalid=("@binary", "@latin", "@missing", "@folder")):
    return mostly(st.sampled_from(valid).map(lambda f: ([f], None)),
                  st.sampled_from(invalid).map(lambda f: ([f], False)))


@st.composite
def command(draw, head, required, optional, max_flags=5):
    """A command line: ``head``, the required pieces, then a few optional flags with drawn values."""
    pieces = [draw(piece) for piece in required]
    for flag in draw(st.lists(st.sampled_from(sorted(optional)), max_size=max_flags, unique=True)):
        tokens, valid = draw(optional[flag])
        pieces.append(([flag, *tokens], valid))
    argv = [*head, *(t for tokens, _ in pieces for t in tokens)]
    verdicts = [valid for _, valid in pieces]
    return argv, False if False in verdicts else None


MODELS = ["llama-3.1-8b", "qwen2.5-0.5b", "mixtral-8x7b", "llama-3.1-70b", "deepseek-v2-lite", "@config"]
GPUS = ["h100", "l4", "rtx 4090", "apple m4 max (40-core gpu)", "amd epyc 9654", "mi300x", "local"]
ESTIMATE_FLAGS = {
    "--gpus": whole(1, 65_536, [1, 2, 4, 8]), "--tp": whole(1, 65_536, [1, 2, 4]),
    "--pp": whole(1, 65_536, [1, 2]), "--ep": whole(1, 65_536, [1, 2]), "--attention-dp": SWITCH,
    "--devices-per-node": whole(1, 65_536, [1, 8]),
    "--network-gbps": number(1e-3, 1e6, [100.0, 400.0, 1e6, 0.001]),
    "--format": names(["bf16", "fp8", "int4-awq", "Q4_K_M", "nvfp4", "f32"]),
    "--kv-format": names(["f16", "fp8", "q4"]),
    "--batch": whole(1, 10**9, [1, 8, 256, 10**9]), "--prompt": whole(1, 10**9, [1, 128, 8192, 10**9]),
    "--output": whole(1, 10**9, [1, 64, 10**9]),
    "--attention": choice(["fused", "unfused"]), "--kv-alloc": choice(["paged", "contiguous"]),
    "--kv-block": whole(1, 10**9, [1, 16, 10**9]), "--prefix-tokens": whole(0, 10**9, [0, 64, 100]),
    "--offload": choice(["none", "auto"]), "--gpu-layers": whole(1, 10**9, [1, 8, 40]),
    "--host-cpu": names(["AMD Ryzen 9 7950X", "amd epyc 9654"]),
    "--draft-model": names(["llama-3.2-1b", "qwen2.5-0.5b"]), "--draft-tokens": whole(0, 64, [0, 1, 4, 64]),
    "--acceptance": number(0, 1, [0.0, 0.5, 1.0]), "--draft-cost": number(0, 1, [0.0, 0.05, 1.0]),
    "--concurrency": whole(1, 10**9, [1, 32, 10**9]), "--rate": number(1e-6, 1e9, [0.5, 5.0, 1e-6, 1e9]),
    "--chunked-prefill": whole(1, 10**9, [1, 512]),
    "--max-num-seqs": whole(1, 10**9, [1, 256]), "--num-requests": whole(1, 10**9, [500]),
    "--prefix-hit-rate": number(0, 1, [0.5, 0.9]),
    "--expert-skew": number(0, 10, [0.0, 1.0]),
    "--kv-offload": choice(["none", "cpu", "disk"]), "--kv-offload-gib": number(0, 1e6, [0.0, 64.0]),
    "--lengths": st.one_of(file_arg(["@lengths", "@bad_lengths"]), names(["chat", "sharegpt"])),
    "--cpu-moe": SWITCH, "--n-cpu-moe": whole(1, 10**9, [1, 4, 100]),
    "--ubatch-size": whole(1, 10**9, [1, 512, 2048]),
    "--memory-gib": number(0, 1e12, [24.0, 64.0, 128.0, 96.0], above=True),
    "--request-rate": number(1e-6, 1e9, [0.5, 1e-6]),
    "--prefill-gpus": whole(1, 65_536, [1, 2]), "--decode-gpus": whole(1, 65_536, [1, 2]),
    "--max-ttft-s": number(0, 1e12, [0.5, 1e-9, 1e12], above=True),
    "--max-itl-s": number(0, 1e12, [0.05, 1e-9], above=True),
    "--max-gpus": whole(1, 128, [1, 2, 4], wide=False),
    "--engine": names(["generic", "vLLM", "llama.cpp", "TensorRT-LLM", "SGLang"]),
    "--calibration": st.one_of(file_arg(["@profile", "@bad_profile"]), names(["auto", "none"], odd=False)),
    "--json": SWITCH, "--db": file_arg(["@db", "@folder"], invalid=("@binary", "@missing")), "--debug": SWITCH,
}


def _fast_search(argv: list[str]) -> list[str]:
    """A target without --max-gpus searches up to 64 devices (seconds): keep the search small."""
    targets = {"--max-ttft-s", "--max-itl-s"} & set(argv)
    return argv + ["--max-gpus", "4"] if targets and "--max-gpus" not in argv else argv


# ---------------------------------------------------------------- input files

BASE_CONFIG = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
               "head_dim": 64, "intermediate_size": 8192, "vocab_size": 128256, "max_position_embeddings": 131072,
               "model_type": "llama", "tie_word_embeddings": True}
BASE_PLAN = {"models": ["llama-3.1-8b"], "workload": {"prompt": 512, "output": 128, "concurrency": 8},
             "targets": {"max_ttft_s": 2.0}, "constraints": {"gpus": ["h100", "l40s"], "max_gpus": 4}}
BASE_ROW = {"id": "a", "framework": "vllm", "hardware": "h100", "n_gpus": "1", "model": "llama-3.1-8b",
            "weight_format": "bf16", "kv_format": "", "batch": "1", "input_len": "512", "output_len": "128",
            "metric": "itl_ms", "value": "8.0", "unit": "ms"}
JUNK_VALUES = [None, 0, -1, 1e30, 10**40, "x", "", [], {}, True, "nan", 0.5, 2**31]


def _paths(doc, prefix=()):
    """Every key path of a nested mapping (lists by index)."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield (*prefix, key)
        yield from _paths(value, (*prefix, key))


@st.composite
def mutated(draw, base):
    """``base`` with a few fields replaced by junk, removed, or joined by an unknown key."""
    doc = copy.deepcopy(base)
    paths = list(_paths(doc))
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        path = draw(st.sampled_from(paths))
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = draw(st.sampled_from(["junk", "junk", "drop", "extra"]))
            if action == "junk":
                parent[path[-1]] = copy.deepcopy(draw(st.sampled_from(JUNK_VALUES)))
            elif action == "drop" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif isinstance(parent, dict):
                parent["unknown_key"] = 1
        except (KeyError, IndexError, TypeError):
            continue   # an earlier mutation replaced this branch
    return doc


@st.composite
def text_file(draw, documents, dump):
    """File contents: mostly a (mutated) document, else raw junk (empty, binary, not UTF-8) or a document cut short."""
    kind = draw(st.sampled_from(["document"] * 6 + ["junk", "cut"]))
    if kind == "junk":
        return draw(st.sampled_from([b"", b"\x00\x01\x02" * 50, "caf\xe9: 1\n".encode("latin-1"), b"{[", b"- 1\n"]))
    text = dump(draw(documents)).encode()
    return text[: len(text) // 2] if kind == "cut" else text


def csv_file():
    cell = st.one_of(st.sampled_from(list(BASE_ROW.values()) + ["", "0", "-1", "nan", "inf", "1e30", "text"]),
                     st.text(max_size=8))
    row = st.fixed_dictionaries({k: st.one_of(st.just(v), cell) for k, v in BASE_ROW.items()})

    def render(rows, cut):   # quoting is JSON's, not CSV's: a malformed row is as welcome as a good one
        lines = [",".join(BASE_ROW)] + [",".join(json.dumps(v) if "," in v or '"' in v or "\n" in v else v
                                                 for v in r.values()) for r in rows]
        if cut:
            lines[-1] = ",".join(lines[-1].split(",")[:cut])
        return ("\n".join(lines) + "\n").encode()
    return st.one_of(st.builds(render, st.lists(row, min_size=1, max_size=4), st.integers(0, 8)),
                     st.sampled_from([b"", b"id,model\n1,x\n", b"\xff\xfe\x00" * 40]))


def _hashes(folder: Path) -> dict:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Input files shared by every example (checked unchanged after each) and a folder for outputs."""
    root = tmp_path_factory.mktemp("fuzz")
    inputs = root / "inputs"
    (inputs / "db").mkdir(parents=True)
    (inputs / "config.json").write_text(json.dumps(BASE_CONFIG))
    (inputs / "profile.yaml").write_text(PROFILE.read_text())
    (inputs / "bad_profile.yaml").write_text(PROFILE.read_text().replace("kind: cpu", "kind: tpu"))
    (inputs / "plan.yaml").write_text(yaml.safe_dump(BASE_PLAN))
    (inputs / "lengths.csv").write_text("prompt,output\n100,20\n3000,400\n")
    (inputs / "bad_lengths.csv").write_text("prompt,output\n100,-2\n")
    (inputs / "binary.bin").write_bytes(bytes(range(256)) * 8)
    (inputs / "latin.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    (inputs / "db" / "card.yaml").write_text(yaml.safe_dump(_db_entry("hardware")))
    (inputs / "folder").mkdir()
    outputs = root / "outputs"
    outputs.mkdir()
    return {"inputs": inputs, "outputs": outputs, "@gif": outputs / "plot.gif",
            "@config": inputs / "config.json", "@profile": inputs / "profile.yaml", "@db": inputs / "db",
            "@bad_profile": inputs / "bad_profile.yaml", "@plan": inputs / "plan.yaml",
            "@lengths": inputs / "lengths.csv", "@bad_lengths": inputs / "bad_lengths.csv",
            "@binary": inputs / "binary.bin", "@latin": inputs / "latin.yaml", "@folder": inputs / "folder",
            "@missing": root / "missing" / "nothing.yaml"}


def _db_entry(kind: str) -> dict:
    from estimator.specs.database import load_database
    db = load_database()
    if kind == "hardware":
        return {**db.hardware.get("rtx 4090").model_dump(mode="json", exclude_none=True),
                "name": "Fuzz Card", "aliases": ["fuzzcard"]}
    return {**db.models.get("llama-3.2-1b").model_dump(mode="json", exclude_none=True),
            "name": "Fuzz Model", "hf_id": "fuzz/model", "aliases": []}


# ---------------------------------------------------------------- running a case and checking the contract

def _resolve(argv, files) -> list[str]:
    """Replace "@name" tokens by paths; output tokens get a fresh path each time."""
    out = []
    for token in argv:
        if token == "@new_out":
            token = str(files["outputs"] / f"{next(COUNTER)}" / "deeper" / "out.png")
        elif token == "@new_csv":
            token = str(files["outputs"] / f"{next(COUNTER)}.csv")
        elif token == "@existing":
            existing = files["outputs"] / "existing.png"
            existing.write_bytes(b"precious")
            token = str(existing)
        out.append(str(files[token]) if token in files else token)
    return out


def _strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"non-finite {name} in the JSON output")
    return json.loads(text, parse_constant=refuse)


def check(argv, valid, files) -> None:
    argv = _resolve(argv, files)
    before = _hashes(files["inputs"])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    out, err = out.getvalue(), err.getvalue()
    shown = [a if len(a) < 80 else a[:60] + f"...({len(a)})" for a in argv]
    assert code in (0, 2) and "Traceback" not in err, (shown, code, err)
    if valid is False:
        assert code == 2, (shown, out[:300])
    if code == 2:
        assert out == "" and len(err.splitlines()) == 1 and err.startswith("roofline"), (shown, err)
        assert not CLASS_NAME.search(err), (shown, err)
    elif "--json" in argv:
        _strict_json(out)
    else:
        assert not NON_FINITE_TEXT.search(out), (shown, NON_FINITE_TEXT.search(out), out[:2000])
    assert _hashes(files["inputs"]) == before, shown


# ---------------------------------------------------------------- the fuzz tests, one per family of commands

@fuzz(150)
@given(case=st.one_of(
    command(["estimate"], [option("--model", names(MODELS)), option("--gpu", names(GPUS))], ESTIMATE_FLAGS,
            max_flags=4),
    command(["explain", "--model", "llama-3.1-8b", "--gpu", "h100"], [], ESTIMATE_FLAGS, max_flags=3),
    command(["speculation", "--model", "qwen2.5-0.5b", "--gpu", "l4"], [],
            {**ESTIMATE_FLAGS, "--out": st.sampled_from([(["@new_out"], None), (["@existing"], None),
                                                         (["@folder"], False), (["@gif"], False)]),
             "--force": SWITCH}, max_flags=3)))
def test_estimate_explain_and_speculation_flags(files, case):
    argv, valid = case
    check(_fast_search(argv), valid, files)


def _together(first, second):
    """Two pieces as one: invalid if either is, valid only if both are."""
    return st.tuples(first, second).map(
        lambda p: (p[0][0] + p[1][0], False if False in (p[0][1], p[1][1]) else (p[0][1] and p[1][1]) or None))


PLAN_WORKLOAD = [st.one_of(_together(option("--prompt", whole(1, 10**9, [128, 512])),
                                     option("--output", whole(1, 10**9, [64, 128]))),
                           option("--lengths", st.one_of(file_arg(["@lengths", "@bad_lengths"]),
                                                         names(["chat", "sharegpt@229/217", "random-r0.5"])))),
                 st.one_of(option("--concurrency", whole(1, 10**9, [1, 8, 64])),
                           option("--rate", number(1e-6, 1e9, [0.5, 4.0, 1e-6])))]
PLAN_FLAGS = {
    "--max-ttft-s": number(0, 1e12, [0.5, 2.0], above=True),
    "--min-tps-per-user": number(0, 1e12, [10.0, 50.0], above=True),
    "--percentile": choice(["p50", "p90"]),
    "--latency-percentile": choice(["p50", "p90", "p99"]), "--max-num-seqs": whole(1, 10**9, [4, 256]),
    "--prefix-hit-rate": number(0, 1, [0.0, 0.5, 0.9]),
    "--formats": st.one_of(names(["bf16,fp8", "int4-awq", "Q4_K_M,nvfp4"]), st.just(([",,"], False))),
    "--min-bits": number(0, 32, [4.0, 8.0, 16.0], above=True),
    "--gpus": names(["h100,l40s", "rtx 4090", "l4,h200", "consumer_gpu"]),
    "--max-gpus": whole(1, 1024, [1, 2, 8, 1024], wide=False), "--on-prem": SWITCH,
    "--budget": number(0, 1e12, [1e3, 1e6], above=True), "--engine": names(["vLLM", "SGLang", "generic"]),
    "--price": st.one_of(st.sampled_from(["h100=2.5", "NVIDIA H100 SXM=3", "l40s=1"]).map(lambda v: ([v], True)),
                         st.sampled_from(["h100=0", "h100=-1", "h100=nan", "h100=inf", "=5", "h100", "h100="])
                         .map(lambda v: ([v], False))),
    "--devices-per-node": whole(1, 1024, [1, 8, 1024], wide=False), "--json": SWITCH,
    "--model": names(["qwen2.5-0.5b", "mixtral-8x7b"]),
    "--db": file_arg(["@db"], invalid=("@binary", "@missing")), "--debug": SWITCH,
}


@fuzz(50)
@given(case=st.one_of(
    command(["plan", "--model", "llama-3.1-8b", "--gpus", "h100,l40s"], PLAN_WORKLOAD, PLAN_FLAGS, max_flags=4),
    command(["plan"], [file_arg(["@plan"])], {"--json": SWITCH, "--model": names(["llama-3.1-8b"]),
                                           "--on-prem": SWITCH, "--latency-percentile": choice(["p99"])},
            max_flags=2)))
def test_plan_flags(files, case):
    check(*case, files)


@fuzz(40)
@given(case=st.one_of(
    command(["list"], [choice(["gpus", "models", "formats"])],
            {"--vendor": names(["NVIDIA", "AMD", "Apple"]), "--class": choice(["datacenter_gpu", "cpu"]),
             "--family": names(["llama", "qwen"]), "--min-memory-gib": number(0, 1e12, [0.0, 24.0, 1e12]),
             "--moe": SWITCH, "--json": SWITCH, "--db": file_arg(["@db"], invalid=("@binary", "@missing"))}),
    command(["show"], [choice(["gpu", "model"]), names(["h100", "llama-3.1-8b", "fuzzcard"])],
            {"--json": SWITCH, "--db": file_arg(["@db"], invalid=("@binary", "@missing"))}),
    command(["check"], [], {"--db": file_arg(["@db"], invalid=("@binary", "@missing")), "--debug": SWITCH})))
def test_list_show_and_check_flags(files, case):
    check(*case, files)


def _write_input(files, name: str, content: bytes) -> Path:
    path = files["inputs"] / f"{next(COUNTER)}-{name}"
    path.write_bytes(content)
    return path


@fuzz(35)
@given(content=csv_file(), out=st.sampled_from(["@new_csv", "@existing", "@folder"]), force=st.booleans())
def test_predict_csv_files(files, content, out, force):
    path = _write_input(files, "in.csv", content)
    valid = False if out == "@folder" or b"\x00" in content or b"\xff" in content else None
    check(["predict", "--csv", str(path), "--out", out, *(["--force"] if force else [])], valid, files)


@fuzz(30)
@given(content=text_file(mutated(BASE_PLAN), yaml.safe_dump), as_json=st.booleans())
def test_plan_files(files, content, as_json):
    path = _write_input(files, "plan.yaml", content)
    check(["plan", str(path), *(["--json"] if as_json else [])], None, files)


@fuzz(30)
@given(content=text_file(mutated(yaml.safe_load(PROFILE.read_text())), yaml.safe_dump),
       gpu=st.sampled_from(["local", "h100", "l4"]), compare=st.booleans())
def test_calibration_profiles(files, content, gpu, compare):
    path = _write_input(files, "profile.yaml", content)
    argv = (["calibrate", "--compare", str(path), "@profile"] if compare else
            ["estimate", "--model", "qwen2.5-0.5b", "--gpu", gpu, "--calibration", str(path), "--json"])
    check(argv, None, files)


@fuzz(30)
@given(content=text_file(mutated(BASE_CONFIG), json.dumps), gpu=st.sampled_from(["h100", "rtx 4090"]),
       folder=st.booleans())
def test_config_json_files(files, content, gpu, folder):
    if folder:   # --model also takes the folder holding a config.json
        path = files["inputs"] / f"{next(COUNTER)}-model"
        path.mkdir()
        (path / "config.json").write_bytes(content)
    else:
        path = _write_input(files, "config.json", content)
    check(["estimate", "--model", str(path), "--gpu", gpu, "--json"], None, files)


@fuzz(12)
@given(hardware=mostly(st.just(_db_entry("hardware")), mutated(_db_entry("hardware"))),
       model=mostly(st.just(_db_entry("model")), mutated(_db_entry("model"))),
       junk=st.sampled_from([False, False, False, True]))
def test_db_folders(files, hardware, model, junk):
    folder = files["inputs"] / f"db-{next(COUNTER)}"
    folder.mkdir()
    (folder / "card.yaml").write_text(yaml.safe_dump(hardware))
    (folder / "models").mkdir()
    (folder / "models" / "model.yml").write_bytes(b"\x00\xff" if junk else yaml.safe_dump(model).encode())
    check(["estimate", "--model", "fuzz-model", "--gpu", "fuzzcard", "--db", str(folder), "--json"],
          False if junk else None, files)


# Slow commands: only command lines that must be refused before any measuring, fitting or rendering.
SLOW_INVALID = st.one_of(
    st.sampled_from([
        ["validate"], ["validate", "--published", "--local"], ["validate", "--published", "--device", "cpu"],
        ["validate", "--published", "--quick"], ["validate", "--published", "--model", "llama-3.2-1b"],
        ["validate", "--local", "--write", "@folder"], ["validate", "--local", "--plot", "@new_out"],
        ["validate", "--published", "--write", "@folder"], ["validate", "--published", "--write", "@missing",
                                                            "--force"],
        ["validate", "--published", "--write", "@binary", "--force"],
        ["validate", "--published", "--plot", "@existing"],
        ["validate", "--published", "--plot", "@folder"], ["validate", "--published", "--plot", "@gif"],
        ["validate", "--published", "--force"], ["validate", "--local", "--force"],
        ["validate", "--published", "--batch", "4"], ["validate", "--published", "--calibration", "@profile"],
        ["validate", "--local", "--batch", "0"], ["validate", "--local", "--prompt", "-1"],
        ["validate", "--local", "--output", "1"], ["validate", "--local", "--calibration", "@binary"],
        ["validate", "--local", "--jobs", "2"], ["validate", "--published", "--jobs", "0"],
        ["validate", "--published", "--jobs", "nan"],
        ["calibrate", "--force"], ["calibrate", "--out", "@existing"], ["calibrate", "--out", "@folder"],
        ["calibrate", "--quick", "--full"], ["calibrate", "--compare", "@profile"],
        ["calibrate", "--compare", "@profile", "@profile", "--device", "cpu"],
        ["calibrate", "--compare", "@profile", "@profile", "--out", "@new_out"],
        ["calibrate", "--compare", "@binary", "@profile"], ["calibrate", "--compare", "@missing", "@latin"],
        ["report", "@plan"], ["report", "@plan", "--out", "@existing"], ["report", "@plan", "--out", "@folder"],
        ["report", "@binary", "--out", "@new_out"], ["report", "@missing", "--out", "@new_out", "--format", "pdf"],
        ["report", "@plan", "--out", "@new_out", "--format", "docx"], ["report", "@latin", "--out", "@new_out"],
    ]).map(lambda argv: (argv, False)),
    st.tuples(st.sampled_from([["validate", "--local", "--device"], ["calibrate", "--device"]]),
              st.sampled_from(["tpu", "", "gpu0", "CPU"])).map(lambda x: ([*x[0], x[1]], False)),
    st.tuples(st.sampled_from([["validate", "--published", "--plot"], ["calibrate", "--out"],
                               ["report", "@plan", "--out"], ["calibrate", "--compare", "@profile"]]),
              st.sampled_from(["", " ", "\x00", "x" * 5000, "a\nb"])).map(lambda x: ([*x[0], x[1]], False)))


@fuzz(40)
@given(case=SLOW_INVALID, debug=st.booleans())
def test_slow_commands_with_invalid_input(files, case, debug):
    argv, valid = case
    check(argv + (["--debug"] if debug else []), valid, files)


def test_every_flag_of_the_parser_is_fuzzed():
    """A flag added to the command line without a fuzz strategy fails here."""
    from estimator.cli_flags import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    flags = {f for name in ("estimate", "explain", "speculation") for a in sub.choices[name]._actions
             for f in a.option_strings if f.startswith("--") and f != "--help"}
    fuzzed = set(ESTIMATE_FLAGS) | {"--model", "--gpu", "--out", "--force"}   # model and gpu: drawn for every case
    assert flags - fuzzed == set()


def test_every_plan_flag_is_fuzzed():
    """A `roofline plan` flag added without a fuzz strategy fails here (an alias is fuzzed by its main spelling)."""
    from estimator.cli_flags import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    flags = {a.option_strings[0] for a in sub.choices["plan"]._actions
             if a.option_strings and a.option_strings[0].startswith("--")}
    assert flags - set(PLAN_FLAGS) - {"--prompt", "--output", "--lengths", "--concurrency", "--rate"} == set()
