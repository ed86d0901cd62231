"""Local checkpoints: GGUF and safetensors headers give shapes and the exact bytes stored.

Files are built at test time: GGUF with gguf.GGUFWriter (quantized tensors written as raw blocks
with an explicit ggml type), safetensors as an 8-byte header length, a JSON header and zero bytes.
Every expected byte count below is counted by hand from the tensor list, not by the code under test.
"""

from __future__ import annotations

import json
import struct

import gguf
import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as Q
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from estimator.errors import ConfigurationError, RooflineError
from estimator.evaluation.api import estimate, resolve_model
from estimator.evaluation.columns import format_columns, model_columns
from estimator.physics.params import count_params
from estimator.physics.traffic import weight_bytes_stored
from estimator.specs.gguf_file import read_gguf, read_header
from estimator.specs.safetensors_file import read_safetensors_folder
from estimator.specs.stored import StoredModelSpec

Q8_ROW64 = 64 // 32 * 34       # one row of 64 weights in Q8_0: 2 blocks of 34 bytes = 68
Q4K_ROW256, Q6K_ROW256 = 144, 210   # one 256-weight super-block of Q4_K, of Q6_K (ggml-common.h)

# The tiny llama GGUF: d = 64, 2 layers, 4 heads of 16, 2 KV heads, d_ff = 256, vocabulary 100.
LLAMA_ATTN = (64 + 32 + 32 + 64) * Q8_ROW64            # q, k, v, o rows in Q8_0: 13,056
LLAMA_GATE_UP = 2 * 256 * 64 * 2                        # two F16 matrices: 65,536
LLAMA_NORMS = 2 * 64 * 4                                # attn_norm, ffn_norm in F32: 512
LLAMA_DOWN = (64 * Q4K_ROW256, 64 * Q6K_ROW256)         # layer 0 in Q4_K, layer 1 in Q6_K: 9,216, 13,440
LLAMA_EMBEDDING, LLAMA_HEAD = 100 * Q8_ROW64, 100 * 64 * 2   # Q8_0 token table, F16 output: 6,800, 12,800
LLAMA_TOTAL = (LLAMA_EMBEDDING + LLAMA_HEAD + 2 * (LLAMA_ATTN + LLAMA_GATE_UP + LLAMA_NORMS)
               + sum(LLAMA_DOWN) + 64 * 4)              # + output_norm (F32)
assert LLAMA_TOTAL == 200_720


def _quantized(writer, name, rows, row_len, kind, lead=()):
    block, size = GGML_QUANT_SIZES[kind]
    writer.add_tensor(name, np.zeros((*lead, rows, row_len // block * size), np.uint8), raw_dtype=kind)


def _common(w, arch="llama", d=64, layers=2, heads=4, kv=2, d_ff=256, ftype=15, head_dim=16):
    w.add_name("tiny-" + arch)
    w.add_block_count(layers)
    w.add_embedding_length(d)
    w.add_feed_forward_length(d_ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_context_length(4096)
    if head_dim:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_file_type(ftype)
    w.add_token_list([f"t{i}" for i in range(100)])


def _finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def build_llama(path, split_max_tensors=0, arch="llama", extra=None):
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    _common(w, arch)
    if extra:
        extra(w)
    _quantized(w, "token_embd.weight", 100, 64, Q.Q8_0)
    for i in range(2):
        for name, rows in (("attn_q", 64), ("attn_k", 32), ("attn_v", 32), ("attn_output", 64)):
            _quantized(w, f"blk.{i}.{name}.weight", rows, 64, Q.Q8_0)
        w.add_tensor(f"blk.{i}.ffn_gate.weight", np.zeros((256, 64), np.float16))
        w.add_tensor(f"blk.{i}.ffn_up.weight", np.zeros((256, 64), np.float16))
        _quantized(w, f"blk.{i}.ffn_down.weight", 64, 256, Q.Q4_K if i == 0 else Q.Q6_K)
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(64, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(64, np.float32))
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.add_tensor("output.weight", np.zeros((100, 64), np.float16))
    _finish(w)
    return path


def build_qwen3moe(path):
    """4 experts of width 64, top-2, Q8_0 everywhere, F32 router and norms, tied embedding."""
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    _common(w, "qwen3moe", d_ff=128, ftype=7)
    w.add_expert_count(4)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(64)
    _quantized(w, "token_embd.weight", 100, 64, Q.Q8_0)
    for i in range(2):
        for name, rows in (("attn_q", 64), ("attn_k", 32), ("attn_v", 32), ("attn_output", 64)):
            _quantized(w, f"blk.{i}.{name}.weight", rows, 64, Q.Q8_0)
        for name in ("attn_q_norm", "attn_k_norm"):
            w.add_tensor(f"blk.{i}.{name}.weight", np.ones(16, np.float32))
        for name in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{name}.weight", np.ones(64, np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", np.zeros((4, 64), np.float32))
        for name in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            _quantized(w, f"blk.{i}.{name}.weight", 64, 64, Q.Q8_0, lead=(4,))
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    _finish(w)
    return path


# qwen3moe per layer: attention 13,056 + norms (16+16+64+64)·4 = 640 + router 64·4·4 = 1,024
# + experts 3 tensors × 4 experts × 64 rows × 68 = 52,224; plus the Q8_0 table and output_norm.
MOE_EXPERTS = 2 * 3 * 4 * 64 * Q8_ROW64
MOE_TOTAL = 2 * (LLAMA_ATTN + 640 + 1024) + MOE_EXPERTS + LLAMA_EMBEDDING + 64 * 4
assert MOE_TOTAL == 140_944


def _stored_bytes(spec, fmt=None):
    fmt = fmt or spec.stored_format
    return float(weight_bytes_stored(model_columns([spec]), format_columns([fmt]))[0])


def _per_part_columns(fmt):
    return {"dense_bits": np.array([fmt.dense_bits]), "expert_bits": np.array([fmt.expert_bits]),
            "head_bits": np.array([fmt.head_bits]), "embedding_bits": np.array([fmt.embedding_bits])}


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory):
    return build_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


class TestGGUF:
    def test_shapes_come_from_the_metadata(self, llama_gguf):
        spec = read_gguf(llama_gguf, count_params)
        s = spec.shape
        assert (s.hidden_size, s.num_layers, s.num_attention_heads, s.num_kv_heads, s.head_dim) == (64, 2, 4, 2, 16)
        assert (s.intermediate_size, s.vocab_size, s.max_context, s.mlp_gated) == (256, 100, 4096, True)
        assert not s.tie_word_embeddings and s.moe is None and spec.name == "tiny-llama"

    def test_stored_bytes_are_the_hand_counted_tensors(self, llama_gguf):
        spec = read_gguf(llama_gguf, count_params)
        assert isinstance(spec, StoredModelSpec) and spec.stored_weight_bytes == LLAMA_TOTAL
        assert _stored_bytes(spec) == pytest.approx(LLAMA_TOTAL, rel=1e-12)
        fmt = spec.stored_format
        assert fmt.embedding_bits == pytest.approx(8.5) and fmt.head_bits == pytest.approx(16)
        assert fmt.dequant == "gguf" and "Q4_K_M" in fmt.name
        assert "Q4_K" in fmt.basis and "Q6_K" in fmt.basis

    def test_linear_bits_are_the_mixed_tensors_per_weight(self, llama_gguf):
        fmt = read_gguf(llama_gguf, count_params).stored_format
        linear_weights = 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 256)
        norms_at_2_bytes = (2 * 2 * 64 + 64) * 2   # the formula's norm count, at 2 bytes
        rest = LLAMA_TOTAL - LLAMA_EMBEDDING - LLAMA_HEAD - norms_at_2_bytes
        assert fmt.dense_bits == pytest.approx(rest * 8 / linear_weights)

    def test_estimate_counts_the_exact_bytes(self, llama_gguf):
        spec = resolve_model(str(llama_gguf), None)
        result = estimate(spec, "rtx4090", weight_format=spec.stored_format, calibration=None)
        assert result.memory_weights_bytes == pytest.approx(LLAMA_TOTAL) and result.fits

    def test_reader_agrees_with_gguf_reader(self, llama_gguf):
        meta, tensors = read_header(llama_gguf)
        reference = gguf.GGUFReader(llama_gguf)
        assert [(t.name, t.type_name, t.n_bytes, t.elements) for t in tensors] == \
            [(t.name, t.tensor_type.name, int(t.n_bytes), int(t.n_elements)) for t in reference.tensors]
        assert meta["llama.block_count"] == 2 and meta["general.architecture"] == "llama"

    def test_split_file_reads_every_part(self, tmp_path):
        build_llama(tmp_path / "split.gguf", split_max_tensors=10)
        parts = sorted(tmp_path.glob("split-*-of-*.gguf"))
        assert len(parts) == 3
        spec = read_gguf(parts[1], count_params)   # any part names the whole model
        assert spec.stored_weight_bytes == LLAMA_TOTAL and len(spec.checkpoint_files) == 3
        assert spec.shape.num_layers == 2

    def test_missing_split_part_is_named(self, tmp_path):
        build_llama(tmp_path / "split.gguf", split_max_tensors=10)
        (tmp_path / "split-00002-of-00003.gguf").unlink()
        with pytest.raises(ConfigurationError, match="split-00002-of-00003.gguf is missing"):
            read_gguf(tmp_path / "split-00001-of-00003.gguf", count_params)

    def test_next_token_prediction_layers_are_left_out_and_named(self, tmp_path):
        path = build_llama(tmp_path / "mtp.gguf", extra=lambda w: w.add_uint32("llama.nextn_predict_layers", 1))
        spec = read_gguf(path, count_params)
        layer_1 = LLAMA_ATTN + LLAMA_GATE_UP + LLAMA_NORMS + LLAMA_DOWN[1]
        assert spec.shape.num_layers == 1 and spec.stored_weight_bytes == LLAMA_TOTAL - layer_1
        assert "left out: multi-token-prediction layers" in spec.stored_format.basis

    def test_an_attention_logit_soft_cap_is_read(self, tmp_path):
        """llama.cpp writes Gemma 2's cap as <arch>.attn_logit_softcapping; a file without the key has no cap."""
        capped = build_llama(tmp_path / "capped.gguf", extra=lambda w: w.add_float32("llama.attn_logit_softcapping",
                                                                                  50.0))
        assert read_gguf(capped, count_params).shape.attention_logit_softcap == 50.0
        assert read_gguf(build_llama(tmp_path / "plain.gguf"), count_params).shape.attention_logit_softcap is None

    def test_moe_bytes_per_part(self, tmp_path):
        spec = read_gguf(build_qwen3moe(tmp_path / "moe.gguf"), count_params)
        moe = spec.shape.moe
        assert (moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size) == (4, 2, 64)
        assert spec.shape.tie_word_embeddings and spec.stored_weight_bytes == MOE_TOTAL
        fmt = spec.stored_format
        assert fmt.expert_bits == pytest.approx(8.5)   # Q8_0 experts, exactly
        assert _stored_bytes(spec) == pytest.approx(MOE_TOTAL, rel=1e-12)
        columns = _per_part_columns(fmt)
        assert weight_bytes_stored(model_columns([spec]), columns)[0] == pytest.approx(MOE_TOTAL, rel=1e-12)

    def test_deepseek2_mla_and_leading_dense_layer(self, tmp_path):
        path = tmp_path / "ds.gguf"
        w = gguf.GGUFWriter(str(path), "deepseek2")
        _common(w, "deepseek2", d_ff=128, ftype=1, head_dim=None)
        for key, value in (("deepseek2.attention.kv_lora_rank", 32), ("deepseek2.rope.dimension_count", 16),
                           ("deepseek2.attention.key_length", 48), ("deepseek2.attention.value_length", 32),
                           ("deepseek2.expert_count", 4), ("deepseek2.expert_used_count", 2),
                           ("deepseek2.expert_feed_forward_length", 64), ("deepseek2.expert_shared_count", 1),
                           ("deepseek2.leading_dense_block_count", 1)):
            w.add_uint32(key, value)
        f16 = np.float16
        w.add_tensor("token_embd.weight", np.zeros((100, 64), f16))
        for i in range(2):
            w.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((4 * 48, 64), f16))
            w.add_tensor(f"blk.{i}.attn_kv_a_mqa.weight", np.zeros((48, 64), f16))
            w.add_tensor(f"blk.{i}.attn_kv_a_norm.weight", np.ones(32, np.float32))
            w.add_tensor(f"blk.{i}.attn_kv_b.weight", np.zeros((4 * 64, 32), f16))
            w.add_tensor(f"blk.{i}.attn_output.weight", np.zeros((64, 4 * 32), f16))
            w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(64, np.float32))
            w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(64, np.float32))
            if i == 0:
                for name, shape in (("ffn_gate", (128, 64)), ("ffn_up", (128, 64)), ("ffn_down", (64, 128))):
                    w.add_tensor(f"blk.0.{name}.weight", np.zeros(shape, f16))
            else:
                w.add_tensor("blk.1.ffn_gate_inp.weight", np.zeros((4, 64), np.float32))
                for name in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
                    w.add_tensor(f"blk.1.{name}.weight", np.zeros((4, 64, 64), f16))
                for name in ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"):
                    w.add_tensor(f"blk.1.{name}.weight", np.zeros((64, 64), f16))
        w.add_tensor("output_norm.weight", np.ones(64, np.float32))
        w.add_tensor("output.weight", np.zeros((100, 64), f16))
        _finish(w)
        spec = read_gguf(path, count_params)
        mla, moe = spec.shape.mla, spec.shape.moe
        assert (mla.kv_lora_rank, mla.qk_rope_head_dim, mla.qk_nope_head_dim, mla.v_head_dim) == (32, 16, 32, 32)
        assert (moe.num_dense_layers, moe.num_shared_experts) == (1, 1)
        attention = 64 * 192 + 64 * 48 + 32 * 256 + 128 * 64          # q, kv_a, kv_b, output
        f16_weights = 2 * attention + 3 * 64 * 128 + 3 * 4 * 64 * 64 + 3 * 64 * 64 + 2 * 100 * 64
        router_f32, norms_f32 = 4 * 64 * 4, (2 * (32 + 64 + 64) + 64) * 4
        assert spec.stored_weight_bytes == 2 * f16_weights + router_f32 + norms_f32
        assert _stored_bytes(spec) == pytest.approx(spec.stored_weight_bytes, rel=1e-12)


class TestGGUFErrors:
    def test_unknown_architecture_names_it_and_the_supported(self, tmp_path):
        path = build_llama(tmp_path / "m.gguf", arch="bloom")
        with pytest.raises(ConfigurationError, match=r"architecture 'bloom' is not supported; supported: .*llama"):
            read_gguf(path, count_params)

    def test_a_recurrent_architecture_names_the_missing_mechanism(self, tmp_path):
        path = build_llama(tmp_path / "m.gguf", arch="mamba")
        with pytest.raises(ConfigurationError, match=r"architecture 'mamba' uses state-space or recurrent layers other "
                                                     r"than Gated DeltaNet .* does not model yet"):
            read_gguf(path, count_params)

    def test_not_a_gguf_file(self, tmp_path):
        path = tmp_path / "bad.gguf"
        path.write_bytes(b"NOPE" + bytes(100))
        with pytest.raises(ConfigurationError, match="not a valid GGUF file: it does not start with the GGUF magic"):
            read_gguf(path, count_params)

    def test_missing_file(self, tmp_path):
        with pytest.raises(ConfigurationError, match="does not exist"):
            resolve_model(str(tmp_path / "nothing.gguf"), None)

    def test_truncated_tensor_data(self, tmp_path, llama_gguf):
        cut = tmp_path / "cut.gguf"
        cut.write_bytes(llama_gguf.read_bytes()[:-1000])
        with pytest.raises(ConfigurationError, match="truncated: tensor 'output.weight' ends at byte"):
            read_gguf(cut, count_params)

    @pytest.mark.parametrize("keep", [0, 5, 23, 100, 400, 1500, 2000, 3000])
    def test_truncated_header(self, tmp_path, llama_gguf, keep):
        cut = tmp_path / "cut.gguf"
        cut.write_bytes(llama_gguf.read_bytes()[:keep])
        with pytest.raises(ConfigurationError, match="GGUF"):
            read_gguf(cut, count_params)

    def test_unknown_tensor_type(self, tmp_path, llama_gguf):
        data = bytearray(llama_gguf.read_bytes())
        name = b"output.weight"
        at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4 + 8 * 2
        data[at:at + 4] = struct.pack("<I", 999)
        bad = tmp_path / "type.gguf"
        bad.write_bytes(bytes(data))
        with pytest.raises(ConfigurationError, match="ggml type 999, unknown to gguf"):
            read_gguf(bad, count_params)

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(position=st.integers(0, 2300), value=st.integers(0, 255))
    def test_a_corrupt_byte_never_escapes_as_a_traceback(self, tmp_path, llama_gguf, position, value):
        data = bytearray(llama_gguf.read_bytes())
        data[position] = value
        bad = tmp_path / f"corrupt-{position}-{value}.gguf"
        bad.write_bytes(bytes(data))
        try:
            read_gguf(bad, count_params)
        except RooflineError:
            pass


# ---- safetensors ---------------------------------------------------------------------------

def write_safetensors(path, tensors):
    """tensors: name -> (dtype, shape, bytes); data is zeros, laid out in order."""
    header, offset = {}, 0
    for name, (dtype, shape, n_bytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n_bytes]}
        offset += n_bytes
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


LLAMA_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                "intermediate_size": 256, "vocab_size": 100, "max_position_embeddings": 4096,
                "tie_word_embeddings": False}
LINEAR = {"self_attn.q_proj": (64, 64), "self_attn.k_proj": (32, 64), "self_attn.v_proj": (32, 64),
          "self_attn.o_proj": (64, 64), "mlp.gate_proj": (256, 64), "mlp.up_proj": (256, 64),
          "mlp.down_proj": (64, 256)}   # [out, in]


def _bf16_tensors():
    t = {"model.embed_tokens.weight": ("BF16", (100, 64), 100 * 64 * 2),
         "lm_head.weight": ("BF16", (100, 64), 100 * 64 * 2), "model.norm.weight": ("BF16", (64,), 128)}
    for i in range(2):
        for module, (out, inp) in LINEAR.items():
            t[f"model.layers.{i}.{module}.weight"] = ("BF16", (out, inp), out * inp * 2)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            t[f"model.layers.{i}.{norm}.weight"] = ("BF16", (64,), 128)
    return t


def _folder(tmp_path, tensors, config=LLAMA_CONFIG, files=1):
    (tmp_path / "config.json").write_text(json.dumps(config))
    names = list(tensors)
    chunks = [names[i::files] for i in range(files)]
    if files == 1:
        write_safetensors(tmp_path / "model.safetensors", tensors)
        return tmp_path
    weight_map = {}
    for i, chunk in enumerate(chunks):
        file = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        write_safetensors(tmp_path / file, {n: tensors[n] for n in chunk})
        weight_map.update({n: file for n in chunk})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return tmp_path


class TestSafetensors:
    def test_bf16_checkpoint_is_16_bits_exactly(self, tmp_path):
        tensors = _bf16_tensors()
        spec = resolve_model(str(_folder(tmp_path, tensors, files=2)), None)
        total = sum(n for _, _, n in tensors.values())
        assert spec.stored_weight_bytes == total == 2 * (2 * 100 * 64 + 64 + 2 * (2 * 64 + sum(
            o * i for o, i in LINEAR.values())))
        fmt = spec.stored_format
        assert (fmt.dense_bits, fmt.head_bits, fmt.embedding_bits) == (16, 16, 16)
        assert fmt.dequant == "native" and fmt.compute_dtypes[0] == "bf16"
        assert _stored_bytes(spec) == pytest.approx(total)

    def test_awq_packed_weights_count_as_stored(self, tmp_path):
        group = 32
        tensors = {n: v for n, v in _bf16_tensors().items() if not n.startswith("model.layers") or "norm" in n}
        packed = 0
        for i in range(2):
            for module, (out, inp) in LINEAR.items():
                base = f"model.layers.{i}.{module}"
                tensors[f"{base}.qweight"] = ("I32", (inp, out // 8), inp * out // 8 * 4)       # 8 nibbles per int32
                tensors[f"{base}.qzeros"] = ("I32", (inp // group, out // 8), inp // group * out // 8 * 4)
                tensors[f"{base}.scales"] = ("F16", (inp // group, out), inp // group * out * 2)
                packed += inp * out // 2 + inp // group * out // 2 + inp // group * out * 2
        config = {**LLAMA_CONFIG, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": group}}
        spec = read_safetensors_folder(_folder(tmp_path, tensors, config), count_params)
        weights = 2 * sum(o * i for o, i in LINEAR.values())
        norms = 2 * 2 * 64 + 64
        fmt = spec.stored_format
        assert fmt.dense_bits == pytest.approx(packed * 8 / weights)   # norms stored at 2 bytes, as counted
        assert fmt.dense_bits == pytest.approx(4 + 4 / group + 16 / group)   # 4-bit + packed zero + fp16 scale
        assert fmt.dequant == "weight_only" and fmt.name.startswith("AWQ int4 g32")
        assert spec.stored_weight_bytes == packed + 2 * 100 * 64 * 2 + norms * 2
        assert _stored_bytes(spec) == pytest.approx(spec.stored_weight_bytes)

    def test_fp8_checkpoint_with_scales(self, tmp_path):
        tensors = {n: v for n, v in _bf16_tensors().items() if not n.startswith("model.layers") or "norm" in n}
        for i in range(2):
            for module, (out, inp) in LINEAR.items():
                tensors[f"model.layers.{i}.{module}.weight"] = ("F8_E4M3", (out, inp), out * inp)
                tensors[f"model.layers.{i}.{module}.weight_scale"] = ("F32", (out, 1), out * 4)
        config = {**LLAMA_CONFIG, "quantization_config": {"quant_method": "compressed-tensors", "format":
                  "float-quantized", "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"},
                                                                   "input_activations": {"num_bits": 8}}}}}
        spec = read_safetensors_folder(_folder(tmp_path, tensors, config), count_params)
        weights = 2 * sum(o * i for o, i in LINEAR.values())
        scales = 2 * sum(o for o, _ in LINEAR.values()) * 4
        assert spec.stored_format.dense_bits == pytest.approx((weights + scales) * 8 / weights)
        assert spec.stored_format.compute_dtypes[0] == "fp8"

    def test_vision_tower_is_left_out_and_said(self, tmp_path):
        tensors = {**_bf16_tensors(), "vision_tower.blocks.0.attn.weight": ("BF16", (64, 64), 8192)}
        spec = read_safetensors_folder(_folder(tmp_path, tensors), count_params)
        assert spec.stored_weight_bytes == sum(n for _, _, n in _bf16_tensors().values())
        assert "left out: other towers" in spec.stored_format.basis

    def test_unknown_dtype_is_a_clear_error(self, tmp_path):
        tensors = {**_bf16_tensors(), "model.extra": ("F7_E3M3", (8,), 7)}
        with pytest.raises(ConfigurationError, match=r"dtype 'F7_E3M3', which this reader does not know; known: BOOL"):
            read_safetensors_folder(_folder(tmp_path, tensors), count_params)

    def test_truncated_file_is_a_clear_error(self, tmp_path):
        folder = _folder(tmp_path, _bf16_tensors())
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[:-100])
        with pytest.raises(ConfigurationError, match="is truncated: tensor"):
            read_safetensors_folder(folder, count_params)

    def test_corrupt_header_is_a_clear_error(self, tmp_path):
        folder = _folder(tmp_path, _bf16_tensors())
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", 10) + b"{not json}" + bytes(10))
        with pytest.raises(ConfigurationError, match="header is not JSON"):
            read_safetensors_folder(folder, count_params)

    def test_unsupported_quantization_method_is_named(self, tmp_path):
        config = {**LLAMA_CONFIG, "quantization_config": {"quant_method": "quark"}}
        with pytest.raises(ConfigurationError, match="quantization method 'quark'.*supported: awq, gptq"):
            read_safetensors_folder(_folder(tmp_path, _bf16_tensors(), config), count_params)

    def test_config_json_alone_still_gives_shapes_only(self, tmp_path):
        (tmp_path / "config.json").write_text(json.dumps(LLAMA_CONFIG))
        spec = resolve_model(str(tmp_path), None)
        assert not isinstance(spec, StoredModelSpec) and spec.shape.hidden_size == 64


def test_a_folder_of_one_gguf_model_reads_it(tmp_path):
    build_llama(tmp_path / "only.gguf")
    assert resolve_model(str(tmp_path), None).stored_weight_bytes == LLAMA_TOTAL


def test_cli_estimate_runs_on_a_gguf_file(tmp_path, capsys):
    from estimator.cli import main

    path = build_llama(tmp_path / "x.gguf")
    code = main(["estimate", "--model", str(path), "--gpu", "rtx4090", "--calibration", "none"])
    out = capsys.readouterr().out
    assert code in (0, None) and "tiny-llama" in out and "RTX 4090" in out
