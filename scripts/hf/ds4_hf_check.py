#!/usr/bin/env python3
"""Checks ds4run's DeepSeek-V4 math against Hugging Face transformers'
deepseek_v4 (5.17, fp32) on ds4-flash-mini or on any configuration's
config.json: `make` writes a seeded random checkpoint, `run` writes HF's
logits for a token sequence, `compare` sets two logits files side by side.
scripts/hf/README.md gives the procedure."""

import argparse
import ast
import inspect
import json
import math
import re
import struct
import sys
from array import array
from pathlib import Path

PROG = "ds4_hf_check"
REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / "models" / "ds4-flash-mini.yaml"
HF_VERSION = "5.17.0"
# Where `make` keeps the state dict under HF's own parameter names: a
# subfolder, so that `ds4run --weights OUTDIR` (which reads OUTDIR's own
# *.safetensors only) never sees it.
REFERENCE_DIR = "hf_names"

# The constants the HF config needs that the YAML states only as op attrs;
# check_yaml_constants checks each against the YAML text.
RMS_EPS = 1.0e-6
ROUTED_SCALE = 1.5
SWIGLU_LIMIT = 10.0
MAIN_THETA = 10000.0
COMPRESS_THETA = 160000.0
YARN = {"factor": 16.0, "original_max_position_embeddings": 65536, "beta_fast": 32.0, "beta_slow": 1.0}


# The description language's dtypes; a param holding one is a dtype param.
DTYPES = {"f32", "bf16", "f16", "i32", "f8e4m3", "mxfp4"}


class CheckError(Exception):
    """A failure with a message for the user; main prints it and exits 1."""


# ---------------------------------------------------------------- the YAML

def flow_items(text):
    """Split the body of a YAML flow collection at its top-level commas."""
    items, depth, start = [], 0, 0
    for k, ch in enumerate(text):
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:k].strip())
            start = k + 1
    tail = text[start:].strip()
    if tail:
        items.append(tail)
    return items


def flow_map(text):
    """A one-level YAML flow mapping `{k: v, ...}` as a dict of strings; a
    flow sequence value becomes a list of strings."""
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise CheckError(f"not a flow mapping: {text[:60]}")
    out = {}
    for item in flow_items(text[1:-1]):
        key, sep, value = item.partition(":")
        if not sep:
            raise CheckError(f"flow mapping entry without ':': {item}")
        value = value.strip()
        if value.startswith("["):
            value = flow_items(value[1:-1])
        elif len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        out[key.strip()] = value
    return out


def flow_entries(text):
    """Every `- {...}` flow mapping in text, however many lines it spans."""
    entries, pos = [], 0
    while True:
        start = text.find("- {", pos)
        if start < 0:
            return entries
        depth = 0
        for k in range(start + 2, len(text)):
            depth += text[k] == "{"
            depth -= text[k] == "}"
            if depth == 0:
                entries.append(flow_map(" ".join(text[start + 2:k + 1].split())))
                pos = k + 1
                break
        else:
            raise CheckError(f"unclosed flow mapping at: {text[start:start + 60]}")


def section(text, key):
    """The indented lines under a top-level `key:` (None when absent)."""
    m = re.search(rf"^{key}:[ \t]*(?:#.*)?\n((?:[ \t]+.*\n|[ \t]*\n)*)", text, re.M)
    return m.group(1) if m else None


def param_entries(body):
    """name -> value text of a params section; a flow mapping value (a rope
    table) may go on over the lines below it until its braces close."""
    out, lines, k = {}, body.split("\n"), 0
    while k < len(lines):
        m = re.match(r"^[ \t]+(\w+):[ \t]*([^#]*)", lines[k])
        k += 1
        if not m:
            continue
        value = m.group(2).strip()
        while value.startswith("{") and value.count("{") > value.count("}") and k < len(lines):
            value += " " + lines[k].split("#")[0].strip()
            k += 1
        out[m.group(1)] = value
    return out


def eval_expr(expr, params, what):
    """An expression of the description language: numbers, param names,
    + - * / and parentheses; / divides integers as integers (an integer
    expression) and anything else as floats (a float one)."""
    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
                and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in params:
                raise CheckError(f"{what}: unknown param '{node.id}' in '{expr}'")
            return params[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp):
            a, b = walk(node.left), walk(node.right)
            ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}
            if type(node.op) in ops:
                return ops[type(node.op)]
            if isinstance(node.op, (ast.Div, ast.FloorDiv)):
                return a // b if isinstance(a, int) and isinstance(b, int) else a / b
        raise CheckError(f"{what}: unsupported expression '{expr}'")
    try:
        return walk(ast.parse(str(expr).strip(), mode="eval"))
    except SyntaxError:
        raise CheckError(f"{what}: not an expression: '{expr}'") from None


def eval_int(expr, params, what):
    """An integer expression (shapes, from, repeat)."""
    v = eval_expr(expr, params, what)
    if not isinstance(v, int):
        raise CheckError(f"{what}: '{expr}' is not an integer")
    return v


class Description:
    """What make needs from a model description and its base: the params,
    the layer list, and each block's weights with checkpoint names and the
    op attrs text."""

    def __init__(self, path):
        chain, path = [], Path(path)
        while True:
            text = path.read_text()
            chain.append((path, text))
            m = re.search(r"^extends:\s*(\S+)", text, re.M)
            if not m:
                break
            path = path.parent / m.group(1)
        chain.reverse()  # base first: an extension's params replace the base's
        raw = {}
        self.layers_text = self.blocks_text = None
        for path, text in chain:
            raw.update(param_entries(section(text, "params") or ""))
            self.layers_text = section(text, "layers") or self.layers_text
            self.blocks_text = section(text, "blocks") or self.blocks_text
            self.path = path
        if self.layers_text is None or self.blocks_text is None:
            raise CheckError(f"{self.path}: no layers or blocks section in it or its bases")
        self.params = {}
        for name, expr in raw.items():
            if expr in DTYPES:  # a dtype param: its name
                self.params[name] = expr
            elif expr.startswith("{"):  # a rope table: its fields, type as text
                self.params[name] = {k: v if k == "type" else eval_expr(v, self.params, f"param {name}.{k}")
                                     for k, v in flow_map(expr).items()}
            else:
                self.params[name] = eval_expr(expr, self.params, f"param {name}")
        self.blocks = self._blocks()
        self.instances = self._instances()
        self.layers = [(i, b) for n, i, b in self.instances if n == "layers"]
        if [i for i, _ in self.layers] != list(range(len(self.layers))):
            raise CheckError(f"{self.path}: decoder layer indices are not 0..n-1: {self.layers}")

    def _blocks(self):
        """block name -> (its text, [(tensor, dtype, shape expr, checkpoint)]);
        a block made of parts (`- {name: X, parts: [A, B]}`) is its parts'
        texts and weights in order."""
        blocks, composed = {}, {}
        parts = re.split(r"^  - name:[ \t]*(\w+)[ \t]*\n", self.blocks_text, flags=re.M)
        for m in re.finditer(r"^  - (\{name:[^\n]*parts:[^\n]*\})[ \t]*(?:#.*)?$", self.blocks_text, re.M):
            entry = flow_map(m.group(1))
            composed[entry["name"]] = entry["parts"]
        for name, text in zip(parts[1::2], parts[2::2]):
            text = re.sub(r"^  - \{name:[^\n]*parts:.*$", "", text, flags=re.M)
            weights = [(e["name"], e["dtype"], e["shape"], e["checkpoint"])
                       for e in flow_entries(text)
                       if e.get("role") == "weight" and "checkpoint" in e]
            blocks[name] = (text, weights)
        for name, names in composed.items():
            missing = [n for n in names if n not in blocks]
            if missing:
                raise CheckError(f"{self.path}: block {name} is made of unknown blocks {missing}")
            blocks[name] = ("".join(blocks[n][0] for n in names), [w for n in names for w in blocks[n][1]])
        return blocks

    def _instances(self):
        """Every block instance in order: (layer name, index or None, block)."""
        out = []
        for e in flow_entries(self.layers_text):
            names = e["blocks"] if "blocks" in e else [e["block"]]
            if "repeat" not in e and "from" not in e:
                out.append((e["name"], None, names[0]))
                continue
            first = eval_int(e.get("from", "0"), self.params, "layers: from")
            count = eval_int(e.get("repeat", "1"), self.params, "layers: repeat")
            out += [(e["name"], first + k, names[k % len(names)]) for k in range(count)]
        return out

    def expected_tensors(self):
        """checkpoint name -> (YAML dtype, shape) for every weight of every
        instance; a `{e}` name is one tensor per expert, without the
        leading experts dimension."""
        out = {}
        for _, index, block in self.instances:
            for tensor, dtype, shape, ckpt in self.blocks[block][1]:
                dims = [eval_int(d, self.params, f"{block}.{tensor} shape") for d in shape]
                name = ckpt if index is None else ckpt.replace("{i}", str(index))
                if "{e}" in name:
                    for e in range(dims[0]):
                        out[name.replace("{e}", str(e))] = (dtype, dims[1:])
                else:
                    out[name] = (dtype, dims)
        return out

    def attr_texts(self, key, blocks=None):
        """Every value of op attr `key` in the given blocks, as written."""
        return {m.group(1) for name, (text, _) in self.blocks.items() if blocks is None or name in blocks
                for m in re.finditer(rf"\b{key}:[ \t]*([-\w.+]+)", text)}

    def attr_values(self, key, blocks=None):
        """Every value of op attr `key` in the given blocks (default all),
        its expression evaluated over the params."""
        found = set()
        for name, (text, _) in self.blocks.items():
            if blocks is None or name in blocks:
                found |= {eval_expr(m.group(1), self.params, f"{name}: attr {key}")
                          for m in re.finditer(rf"\b{key}:[ \t]*([-\w.+]+)", text)}
        return found


def attention_kind(block):
    """HF's layer type for one of the description's decoder blocks."""
    kinds = {"swa": "sliding_attention", "csa": "compressed_sparse_attention",
             "hca": "heavily_compressed_attention"}
    prefix = block.split("_")[0]
    if prefix not in kinds or not block.endswith(("_hash", "_score")):
        raise CheckError(f"block '{block}': no HF layer type for it (expected swa_/csa_/hca_ + _hash/_score)")
    return kinds[prefix]


def check_yaml_constants(desc):
    """The constants this script gives HF must be the ones the YAML's ops
    use; a mismatch would make the comparison check something else."""
    def expect(key, want, blocks=None):
        got = {float(v) for v in desc.attr_values(key, blocks)}
        if got != {float(want)}:
            where = ", ".join(sorted(blocks)) if blocks else "all blocks"
            raise CheckError(f"{desc.path}: attr {key} is {sorted(got)} in {where}; this script builds HF with {want}")
    decoder = {b for _, b in desc.layers}
    sliding = {b for b in decoder if b.startswith("swa")}
    compressed = decoder - sliding
    expect("eps", RMS_EPS)
    expect("hc_eps", RMS_EPS)
    expect("swiglu_limit", SWIGLU_LIMIT)
    expect("scale", ROUTED_SCALE, decoder)
    for key in ("theta", "yarn_factor", "yarn_orig", "yarn_beta_fast", "yarn_beta_slow"):
        if desc.attr_texts(key):
            raise CheckError(f"{desc.path}: an op states {key} itself; this script reads the rope tables "
                             "(attr rope) only")
    for blocks, want in ((sliding, {"type": "default", "theta": MAIN_THETA}),
                         (compressed, {"type": "yarn", "theta": COMPRESS_THETA, **YARN})):
        for name in desc.attr_texts("rope", blocks):
            table = desc.params.get(name)
            if not isinstance(table, dict) or {k: table.get(k) for k in want} != want \
                    or set(table) != set(want):
                raise CheckError(f"{desc.path}: rope table {name} is {table}; this script builds HF with {want}")


# ------------------------------------------------------- safetensors, logits

def safetensors_header(path):
    """name -> (dtype, shape) from a safetensors file's JSON header."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"]) for k, v in header.items()}


def read_logits(path, vocab):
    """A raw little-endian float32 [rows, vocab] file as a list of rows."""
    data = Path(path).read_bytes()
    if len(data) % (4 * vocab):
        raise CheckError(f"{path}: {len(data)} bytes is not a whole number of rows of {vocab} float32")
    values = array("f")
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    return [values[r * vocab:(r + 1) * vocab] for r in range(len(values) // vocab)]


def write_logits(path, rows):
    """rows (a [n, vocab] float32 CPU tensor) as raw little-endian float32."""
    values = array("f", rows.reshape(-1).tolist())
    if sys.byteorder != "little":
        values.byteswap()
    Path(path).write_bytes(values.tobytes())


# ------------------------------------------------------------ HF, torch

def require_hf():
    """torch, transformers (with deepseek_v4) and safetensors, or a clear
    error naming what is missing."""
    missing = []
    for name in ("torch", "transformers", "safetensors"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise CheckError(f"this command needs {', '.join(missing)} (pip install torch 'transformers=={HF_VERSION}' "
                         "safetensors); `compare` needs none of them")
    import transformers
    try:
        from transformers import DeepseekV4Config, DeepseekV4ForCausalLM, DynamicCache  # noqa: F401
    except ImportError:
        raise CheckError(f"transformers {transformers.__version__} has no deepseek_v4 model; "
                         f"use {HF_VERSION}") from None
    if transformers.__version__ != HF_VERSION:
        print(f"warning: transformers {transformers.__version__}; this check was written against {HF_VERSION}",
              file=sys.stderr)
    import torch
    # fp32 must mean fp32: no TF32 matmuls on an NVIDIA GPU.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.set_default_dtype(torch.float32)
    return transformers, torch


def make_config(desc):
    """A DeepseekV4Config equal to the description: its params, its layer
    list, and the constants check_yaml_constants confirmed."""
    from transformers import DeepseekV4Config
    p = desc.params
    blocks = [b for _, b in desc.layers]
    config = DeepseekV4Config(
        vocab_size=p["vocab"], hidden_size=p["hidden"], num_hidden_layers=len(blocks),
        num_attention_heads=p["heads"], num_key_value_heads=1, head_dim=p["head_dim"],
        partial_rotary_factor=p["rope_dim"] / p["head_dim"],
        q_lora_rank=p["q_lora"], o_groups=p["o_groups"], o_lora_rank=p["o_lora"],
        sliding_window=p["window"],
        # Explicit layer types and rates: the legacy `compress_ratios` list
        # knows only the ratios 0, 4 and 128, and mini's HCA ratio is 8.
        layer_types=[attention_kind(b) for b in blocks],
        compress_rates={"compressed_sparse_attention": p["csa_ratio"],
                        "heavily_compressed_attention": p["hca_ratio"]},
        mlp_layer_types=["hash_moe" if b.endswith("_hash") else "moe" for b in blocks],
        index_n_heads=p["index_heads"], index_head_dim=p["index_dim"], index_topk=p["index_topk"],
        n_routed_experts=p["experts"], num_experts_per_tok=p["top_k"], n_shared_experts=1,
        moe_intermediate_size=p["moe_ffn"], scoring_func="sqrtsoftplus", norm_topk_prob=True,
        routed_scaling_factor=ROUTED_SCALE, swiglu_limit=SWIGLU_LIMIT,
        hc_mult=p["hc"], hc_sinkhorn_iters=p["sinkhorn_iters"], hc_eps=RMS_EPS, rms_norm_eps=RMS_EPS,
        rope_theta=MAIN_THETA, compress_rope_theta=COMPRESS_THETA,
        # Flat YaRN params: the config keeps them for the "compress" table
        # only (theta 160000, attention_factor forced to 1) and gives the
        # "main" table plain RoPE at rope_theta.
        rope_parameters={"rope_type": "yarn", **YARN},
        tie_word_embeddings=False,
    )
    check_config(config, desc)
    return config


def check_config(config, desc):
    """The fields HF derived must say what the description says."""
    p = desc.params
    blocks = [b for _, b in desc.layers]
    compress = config.rope_parameters.get("compress", {})
    problems = []
    if config.qk_rope_head_dim != p["rope_dim"]:
        problems.append(f"qk_rope_head_dim {config.qk_rope_head_dim}, want {p['rope_dim']}")
    if list(config.layer_types) != [attention_kind(b) for b in blocks]:
        problems.append(f"layer_types {config.layer_types}")
    if [t == "hash_moe" for t in config.mlp_layer_types] != [b.endswith("_hash") for b in blocks]:
        problems.append(f"mlp_layer_types {config.mlp_layer_types}")
    if compress.get("rope_type") != "yarn" or compress.get("rope_theta") != COMPRESS_THETA \
            or compress.get("attention_factor") != 1.0 \
            or any(compress.get(k) != v for k, v in YARN.items()):
        problems.append(f"rope_parameters['compress'] {compress}")
    main = config.rope_parameters.get("main", {})
    if main.get("rope_type") != "default" or main.get("rope_theta") != MAIN_THETA:
        problems.append(f"rope_parameters['main'] {main}")
    if config.tie_word_embeddings:
        problems.append("tie_word_embeddings is on")
    if problems:
        raise CheckError("the HF config disagrees with the description: " + "; ".join(problems))


def expected_inv_freq(rope_dim, theta, yarn):
    """docs/MATH.md §3.2's inverse frequencies, in float64."""
    pairs = range(rope_dim // 2)
    plain = [theta ** (-2.0 * i / rope_dim) for i in pairs]
    if not yarn:
        return plain
    def corr(beta):
        return rope_dim * math.log(yarn["original_max_position_embeddings"] / (beta * 2 * math.pi)) \
            / (2 * math.log(theta))
    lo = max(math.floor(corr(yarn["beta_fast"])), 0)
    hi = min(math.ceil(corr(yarn["beta_slow"])), rope_dim - 1)
    hi = hi + 0.001 if hi == lo else hi
    out = []
    for i, f in zip(pairs, plain):
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
        out.append(f / yarn["factor"] * ramp + f * (1.0 - ramp))
    return out


def desc_rope(desc, name):
    """theta and the YaRN fields (None for a default table) of the
    description's rope table param `name`."""
    table = desc.params.get(name)
    if not isinstance(table, dict):
        raise CheckError(f"{desc.path}: no rope table param {name}")
    if table.get("type") == "default":
        return table["theta"], None
    return table["theta"], {k: table[k] for k in ("factor", "original_max_position_embeddings",
                                                  "beta_fast", "beta_slow")}


def check_rope_tables(model, desc):
    """HF's two rope tables against docs/MATH.md §3.2 with the description's
    main_rope and compress_rope (relative 1e-6: HF builds them in fp32), and
    no cos/sin scaling on either."""
    rot = model.model.rotary_emb
    for table, (theta, yarn) in (("main", desc_rope(desc, "main_rope")),
                                 ("compress", desc_rope(desc, "compress_rope"))):
        got = getattr(rot, f"{table}_inv_freq").double().tolist()
        want = expected_inv_freq(desc.params["rope_dim"], theta, yarn)
        bad = [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if abs(g - w) > 1e-6 * abs(w)]
        if len(got) != len(want) or bad:
            raise CheckError(f"HF's '{table}' rope table {got} differs from docs/MATH.md §3.2's {want}")
        scaling = getattr(rot, f"{table}_attention_scaling")
        if scaling != 1.0:
            raise CheckError(f"HF scales the '{table}' rope cos/sin by {scaling}; docs/MATH.md §3.2 says 1")


# --------------------------------------------------------------- make

def is_bf16_weight(name):
    """Whether the description stores this HF parameter as bf16: the
    projection matrices, the experts, the router gate, the embedding and
    the head. HC matrices, norms, sinks, position biases and the routing
    bias are f32 there."""
    return (name.endswith(("_proj.weight", "experts.gate_up_proj", "experts.down_proj",
                           "mlp.gate.weight", "embed_tokens.weight", "lm_head.weight")))


def fill_value(name, shape, gen, torch, experts, distinct):
    """A seeded value for one HF state-dict entry, by what the entry is.
    Sizes keep every activation O(1): matrices u/sqrt(fan_in), norms near 1;
    HC base and scale of 0.5 make the Sinkhorn mix visibly non-symmetric
    (a transposed mix would show) without saturating its sigmoids."""
    def u(scale=1.0):
        return (torch.rand(shape, generator=gen) * 2 - 1) * scale
    if name.endswith("tid2eid"):
        if distinct:  # the release's rows name distinct experts
            return torch.stack([torch.randperm(experts, generator=gen)[:shape[1]] for _ in range(shape[0])])
        return torch.randint(0, experts, shape, generator=gen)
    if name.endswith("e_score_correction_bias"):
        return u(0.1)  # of the order of the score gaps: it changes some choices
    if name.endswith("norm.weight"):
        return 1.0 + u(0.1)
    if name.endswith(("attn_hc.fn", "ffn_hc.fn", "hc_head.hc_fn")):
        return u(1.0 / math.sqrt(shape[-1]))
    if name.endswith(("_hc.base", "_hc.scale", "hc_head.hc_base", "hc_head.hc_scale")):
        return u(0.5)
    if name.endswith("self_attn.sinks"):
        return u()
    if name.endswith("position_bias"):
        return u(0.5)
    if name.endswith("embed_tokens.weight"):
        return u()  # the YAML's init_scale 1.0 for the table
    if is_bf16_weight(name):
        return u(1.0 / math.sqrt(shape[-1]))
    raise CheckError(f"no fill rule for HF tensor '{name}' {list(shape)}: a transformers change? extend fill_value")


def bf16_matrices(desc):
    """Whether the description holds its matrices in bf16 (its `bf16w`,
    bf16 unless it says f32)."""
    return desc.params.get("bf16w", "bf16") != "f32"


def fill_model(model, seed, torch, experts, distinct, round_bf16=True):
    """Every persistent entry of the model, seeded; bf16-stored weights
    rounded to bf16 values (nearest even) and kept fp32, unless round_bf16
    is off (a description whose matrices are f32)."""
    gen = torch.Generator().manual_seed(seed)
    rounded = []
    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            value = fill_value(name, tuple(t.shape), gen, torch, experts, distinct)
            if round_bf16 and is_bf16_weight(name):
                value = value.to(torch.bfloat16).to(torch.float32)
                rounded.append(name)
            t.data.copy_(value.to(t.dtype))
        for name in rounded:
            bits = model.state_dict()[name].view(torch.int32) & 0xFFFF
            if bits.any():
                raise CheckError(f"{name}: not bf16-exact after rounding")
    return rounded


def state_differences(model, reference, torch):
    """Names where model's state dict differs from reference (missing,
    extra, other shape or dtype, other values)."""
    state = model.state_dict()
    out = [f"missing in the model: {k}" for k in reference if k not in state]
    out += [f"not in the reference: {k}" for k in state if k not in reference]
    for k in reference:
        if k in state:
            a, b = state[k].cpu(), reference[k].cpu()
            if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b):
                out.append(f"differs: {k} {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}")
    return out


def yaml_name(name, expected):
    """The description's checkpoint name that a written name stands for:
    itself, or itself without the `model.` prefix HF keeps on everything
    but the head (None when neither is one)."""
    for candidate in (name, name[len("model."):] if name.startswith("model.") else None):
        if candidate in expected:
            return candidate
    return None


def print_written_names(outdir, desc):
    """Every tensor save_pretrained wrote, against the description's
    checkpoint names (what ds4run's loader looks for)."""
    expected = desc.expected_tensors()
    written = {}
    for f in sorted(Path(outdir).glob("*.safetensors")):
        written.update(safetensors_header(f))
    matched = {name: yaml_name(name, expected) for name in written}
    exact = sum(name == y for name, y in matched.items())
    prefixed = sum(y is not None and name != y for name, y in matched.items())
    print(f"\n{len(written)} tensors written under {outdir}: {exact} under a YAML checkpoint name, "
          f"{prefixed} under one with a 'model.' prefix, {len(written) - exact - prefixed} under none")
    for name in sorted(written):
        dtype, shape = written[name]
        y = matched[name]
        if y is None:
            note = "NO YAML NAME"
        else:
            ydtype, yshape = expected[y]
            note = f"yaml {ydtype}" + ("" if list(yshape) == list(shape) else f", YAML SHAPE {yshape}")
        print(f"  {name:52s} {dtype:5s} {str(shape):12s} {note}")
    absent = sorted(set(expected) - set(matched.values()))
    print(f"\n{len(absent)} YAML checkpoint names written under no name above:")
    for name in absent:
        print(f"  {name}")


def config_from_json(path, desc):
    """A DeepseekV4Config from a config.json, which must give the dimensions
    and layer kinds of the description ds4c import wrote from it."""
    from transformers import DeepseekV4Config
    config = DeepseekV4Config.from_json_file(str(path))
    p = desc.params
    blocks = [b for _, b in desc.layers]
    problems = [f"{field} {getattr(config, field)}, the description's {key} {p[key]}"
                for field, key in (("vocab_size", "vocab"), ("hidden_size", "hidden"),
                                   ("num_attention_heads", "heads"), ("head_dim", "head_dim"),
                                   ("n_routed_experts", "experts"), ("num_experts_per_tok", "top_k"),
                                   ("sliding_window", "window"), ("hc_mult", "hc"))
                if getattr(config, field) != p[key]]
    if list(config.layer_types) != [attention_kind(b) for b in blocks]:
        problems.append(f"layer_types {list(config.layer_types)}")
    if [t == "hash_moe" for t in config.mlp_layer_types] != [b.endswith("_hash") for b in blocks]:
        problems.append(f"mlp_layer_types {list(config.mlp_layer_types)}")
    if problems:
        raise CheckError(f"{path} and {desc.path} disagree (import the config again?): " + "; ".join(problems))
    return config


def cmd_make(args):
    desc = Description(args.model)
    transformers, torch = require_hf()
    from safetensors.torch import save_file
    from transformers import DeepseekV4ForCausalLM
    if args.config:  # any configuration: its own constants, the description ds4c import wrote from it
        config = config_from_json(args.config, desc)
    else:
        check_yaml_constants(desc)
        config = make_config(desc)
    model = DeepseekV4ForCausalLM(config).to(torch.float32).eval()
    check_rope_tables(model, desc)
    # a description holding its matrices in f32 gets them unrounded
    rounded = fill_model(model, args.seed, torch, desc.params["experts"], not args.tid2eid_repeats,
                         bf16_matrices(desc))
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    for old in outdir.glob("*.safetensors"):
        old.unlink()  # a stale shard would be read by ds4run too
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_kwargs = {}
    params = inspect.signature(model.save_pretrained).parameters
    if "safe_serialization" in params:  # 4.x; 5.x writes safetensors only
        save_kwargs["safe_serialization"] = True
    if args.store_bf16:
        save_kwargs["state_dict"] = {k: v.to(torch.bfloat16) if k in rounded else v for k, v in state.items()}
    model.save_pretrained(outdir, **save_kwargs)
    (outdir / REFERENCE_DIR).mkdir(exist_ok=True)
    save_file(state, str(outdir / REFERENCE_DIR / "model.safetensors"))
    print(f"{PROG}: transformers {transformers.__version__}, torch {torch.__version__}; seed {args.seed}")
    print(f"layers: {list(config.layer_types)}; mlp: {list(config.mlp_layer_types)}; "
          f"compress_rates {config.compress_rates}")
    print(f"rope: {config.rope_parameters}")
    print(f"{len(rounded)} of {len(state)} tensors rounded to bf16 values "
          f"(stored as {'bf16' if args.store_bf16 else 'f32'})")
    print_written_names(outdir, desc)
    loaded = DeepseekV4ForCausalLM.from_pretrained(outdir, dtype=torch.float32)
    diffs = state_differences(loaded, state, torch)
    if diffs:
        print(f"\nWARNING: from_pretrained({outdir}) does not give back the saved model ({len(diffs)} problems); "
              f"`run --load reference` avoids HF's loader:")
        for d in diffs:
            print(f"  {d}")
    else:
        print(f"\nround trip: from_pretrained({outdir}) gives back all {len(state)} tensors exactly")
    return 0


# ---------------------------------------------------------------- run

def load_model(args, torch):
    """OUTDIR's model in fp32: through from_pretrained, checked tensor by
    tensor against the reference state dict, or from that state dict."""
    from safetensors.torch import load_file
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
    ref_path = Path(args.weights) / REFERENCE_DIR / "model.safetensors"
    if not ref_path.exists():
        raise CheckError(f"{ref_path}: missing; make writes it next to the checkpoint")
    reference = load_file(str(ref_path))
    if args.load == "reference":
        model = DeepseekV4ForCausalLM(DeepseekV4Config.from_pretrained(args.weights)).to(torch.float32)
        model.load_state_dict(reference, strict=True)
    else:
        model = DeepseekV4ForCausalLM.from_pretrained(args.weights, dtype=torch.float32)
        diffs = state_differences(model, reference, torch)
        if diffs:
            raise CheckError(f"from_pretrained({args.weights}) gives other weights than make saved "
                             f"({len(diffs)} problems, first: {diffs[0]}); use --load reference")
    return model.to(args.device).eval()


class TieWatch:
    """Reports exact ties at the lightning indexer's top-k boundary: there
    torch.topk's choice is unspecified (docs/MATH.md §15.2), so a difference
    after such a position need not be a bug."""

    def __init__(self, model):
        self.ties = []
        for name, module in model.named_modules():
            if type(module).__name__ == "DeepseekV4Indexer":
                layer = int(re.search(r"layers\.(\d+)\.", name).group(1))
                module.register_forward_pre_hook(self._positions(module))
                module.scorer.register_forward_hook(self._scores(module, layer))

    @staticmethod
    def _positions(indexer):
        def hook(_, args):
            indexer.tie_watch_positions = args[2]  # forward(hidden, q_residual, position_ids, ...)
        return hook

    def _scores(self, indexer, layer):
        def hook(_, __, scores):
            k = indexer.index_topk
            for s, pos in enumerate(indexer.tie_watch_positions[0].tolist()):
                visible = sorted(scores[0, s, :(pos + 1) // indexer.compress_rate].tolist(), reverse=True)
                if len(visible) > k and visible[k - 1] == visible[k]:
                    self.ties.append((layer, pos, visible[k]))
        return hook


def forward_rows(model, ids, args, torch):
    """HF's logits for every position of ids: one stateless forward, or
    prefill (whole, or in chunks) then one decode step per token."""
    from transformers import DynamicCache
    tokens = torch.tensor([ids], dtype=torch.long, device=args.device)
    if args.stateless:
        return model(input_ids=tokens, use_cache=False).logits[0]
    cache = DynamicCache(config=model.config)
    step = args.chunk or args.prompt_len
    bounds = list(range(0, args.prompt_len, step)) + list(range(args.prompt_len, len(ids)))
    rows = []
    for start, end in zip(bounds, bounds[1:] + [len(ids)]):
        out = model(input_ids=tokens[:, start:end], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        rows.append(out.logits[0])
    return torch.cat(rows)


def parse_ids(text, vocab):
    try:
        ids = [int(t) for t in text.split(",")]
    except ValueError:
        raise CheckError(f"--ids: not comma-separated integers: {text}") from None
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise CheckError(f"--ids: {bad} outside the vocabulary 0..{vocab - 1}")
    return ids


def cmd_run(args):
    transformers, torch = require_hf()
    model = load_model(args, torch)
    ids = parse_ids(args.ids, model.config.vocab_size)
    if not args.stateless and not 1 <= args.prompt_len <= len(ids):
        raise CheckError(f"--prompt-len {args.prompt_len}: needs 1..{len(ids)} (the number of ids)")
    watch = TieWatch(model)
    with torch.no_grad():
        for _ in range(args.generate):
            ids.append(int(forward_rows(model, ids, args, torch)[-1].argmax()))
            watch.ties.clear()  # only the final pass over the whole sequence counts
        rows = forward_rows(model, ids, args, torch).float().cpu()
    write_logits(args.out, rows)
    mode = "stateless" if args.stateless else \
        f"prefill {args.prompt_len}" + (f" in chunks of {args.chunk}" if args.chunk else "") + " + decode"
    print(f"{PROG}: transformers {transformers.__version__}, {mode}, {args.device}, fp32")
    print(f"ids:    {','.join(map(str, ids))}")
    print(f"argmax: {','.join(str(int(r.argmax())) for r in rows)}")
    print(f"wrote {args.out}: {rows.shape[0]} rows x {rows.shape[1]} float32")
    for layer, pos, value in sorted(set(watch.ties)):
        print(f"indexer top-k tie: layer {layer}, position {pos}, score {value!r} at the boundary")
    return 0


# ------------------------------------------------------------- teacher

def cmd_teacher(args):
    """make --config (with --store-bf16 unless the description keeps its
    matrices in f32), then run over a seeded random prompt of --tokens ids
    in one stateless forward (teacher-forced: every position's logits from
    the prompt itself), writing OUT/hf (the checkpoint), OUT/ids.txt and
    OUT/hf.bin."""
    import random
    out = Path(args.out)
    desc = Description(args.model)
    # the matrices stored as the description stores them: rounded to bf16
    # values, an F32 checkpoint would need ds4run --weights-cast
    code = cmd_make(argparse.Namespace(out=str(out / "hf"), model=args.model, seed=args.seed,
                                       store_bf16=bf16_matrices(desc), tid2eid_repeats=False,
                                       config=args.config))
    if code:
        return code
    vocab = desc.params["vocab"]
    rng = random.Random(args.seed)
    ids = ",".join(str(rng.randrange(vocab)) for _ in range(args.tokens))
    (out / "ids.txt").write_text(ids + "\n")
    return cmd_run(argparse.Namespace(weights=str(out / "hf"), ids=ids, prompt_len=args.tokens, chunk=0,
                                      stateless=True, generate=0, out=str(out / "hf.bin"), device=args.device,
                                      load="pretrained"))


# ------------------------------------------------------------- compare

def cmd_compare(args):
    vocab = args.vocab or Description(args.model).params["vocab"]
    ours, ref = read_logits(args.ours, vocab), read_logits(args.reference, vocab)
    if args.tail:
        if args.tail > min(len(ours), len(ref)):
            raise CheckError(f"--tail {args.tail}: the files have {len(ours)} and {len(ref)} rows")
        ours, ref = ours[-args.tail:], ref[-args.tail:]
    if len(ours) != len(ref):
        raise CheckError(f"{args.ours} has {len(ours)} rows, {args.reference} {len(ref)} (vocab {vocab}); "
                         "--tail N compares the last N of each")
    if args.head:
        ours, ref = ours[:args.head], ref[:args.head]
    print(f"{'pos':>4} {'max|err|':>12} {'max|logit|':>12} {'rel':>10}  argmax ours/ref")
    worst, worst_pos, agree, first_disagree = 0.0, 0, 0, None
    for pos, (a, b) in enumerate(zip(ours, ref)):
        err = max(abs(x - y) for x, y in zip(a, b))
        scale = max(abs(y) for y in b)
        rel = err / scale if scale > 0 else err
        if math.isnan(rel):
            rel = math.inf  # a NaN anywhere fails the check
        am, bm = max(range(vocab), key=a.__getitem__), max(range(vocab), key=b.__getitem__)
        agree += am == bm
        if am != bm and first_disagree is None:
            first_disagree = pos
        if rel > worst:
            worst, worst_pos = rel, pos
        flag = "" if rel <= args.tol else "  > tol"
        print(f"{pos:4d} {err:12.4e} {scale:12.4e} {rel:10.3e}  {am}/{bm}{'' if am == bm else ' DIFFER'}{flag}")
    ok = worst <= args.tol
    note = "" if first_disagree is None else f"; first argmax difference at {first_disagree}"
    print(f"summary: {len(ref)} positions, worst rel {worst:.3e} at {worst_pos} (tol {args.tol:g}), "
          f"argmax agrees at {agree}/{len(ref)}{note}: {'PASS' if ok else 'FAIL'}")
    if args.first_tie is None:
        return 0 if ok else 1
    # Past an exact top-k tie the two sides may choose other entries or
    # experts; the verdict is on the positions before it.
    before = [(max(abs(x - y) for x, y in zip(a, b)), max(abs(y) for y in b), a, b)
              for a, b in list(zip(ours, ref))[:args.first_tie]]
    rels = [e / s if s > 0 else e for e, s, _, _ in before]
    rels = [math.inf if math.isnan(r) else r for r in rels]
    worst_before = max(rels, default=0.0)
    agree_before = sum(max(range(vocab), key=a.__getitem__) == max(range(vocab), key=b.__getitem__)
                       for _, _, a, b in before)
    ok_before = worst_before <= args.tol and len(before) > 0
    print(f"before the first tie (position {args.first_tie}): {len(before)} positions, worst rel "
          f"{worst_before:.3e} (tol {args.tol:g}), argmax agrees at {agree_before}/{len(before)}: "
          f"{'PASS' if ok_before else 'FAIL'}")
    return 0 if ok_before else 1


# ---------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    mk = sub.add_parser("make", help="write a seeded random checkpoint with HF's save_pretrained")
    mk.add_argument("--out", required=True, help="output folder (its *.safetensors are replaced)")
    mk.add_argument("--model", default=str(DEFAULT_MODEL), help="model description (default: %(default)s)")
    mk.add_argument("--seed", type=int, default=1, help="torch.Generator seed (default: %(default)s)")
    mk.add_argument("--store-bf16", action="store_true",
                    help="store the bf16-rounded weights as BF16, as the release does (default: F32)")
    mk.add_argument("--tid2eid-repeats", action="store_true",
                    help="let a tid2eid row name an expert twice (default: distinct experts per row)")
    mk.add_argument("--config", default=None,
                    help="build HF's model from this config.json (any DeepSeek-V4 configuration; --model is "
                         "then the description `ds4c import` wrote from it) instead of from --model's params")

    rn = sub.add_parser("run", help="HF's fp32 logits for a token sequence")
    rn.add_argument("--weights", required=True, help="the folder `make` wrote")
    rn.add_argument("--ids", required=True, help="comma-separated token ids: the prompt, then generated tokens")
    rn.add_argument("--prompt-len", type=int, default=0, help="tokens of --ids prefilled in one forward")
    rn.add_argument("--chunk", type=int, default=0, help="prefill in chunks of this many tokens (default: one)")
    rn.add_argument("--stateless", action="store_true", help="the whole sequence in one forward, no cache")
    rn.add_argument("--generate", type=int, default=0, help="append this many greedy tokens to --ids first")
    rn.add_argument("--out", required=True, help="raw little-endian float32 [ntokens, vocab] logits")
    rn.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    rn.add_argument("--load", choices=("pretrained", "reference"), default="pretrained",
                    help="from_pretrained, checked against make's reference state dict (default), "
                         "or that state dict itself")

    tf = sub.add_parser("teacher", help="make --config, then HF's logits over a seeded random prompt "
                                        "(teacher-forced, one forward)")
    tf.add_argument("--config", required=True, help="a DeepSeek-V4 config.json")
    tf.add_argument("--model", required=True, help="the description `ds4c import` wrote from it")
    tf.add_argument("--out", required=True, help="folder for hf/ (the checkpoint), ids.txt and hf.bin")
    tf.add_argument("--tokens", type=int, default=64, help="prompt length (default: %(default)s)")
    tf.add_argument("--seed", type=int, default=1, help="weights' and prompt's seed (default: %(default)s)")
    tf.add_argument("--device", default="cpu", help="torch device (default: cpu)")

    cp = sub.add_parser("compare", help="two logits files, per position; exit 1 above --tol")
    cp.add_argument("ours", help="ds4run's --dump-logits file")
    cp.add_argument("reference", help="run's --out file (the denominator of rel)")
    cp.add_argument("--tol", type=float, default=1e-4, help="largest relative error allowed (default: %(default)g)")
    cp.add_argument("--vocab", type=int, default=0, help="row length (default: the --model's vocab)")
    cp.add_argument("--model", default=str(DEFAULT_MODEL), help="model description (default: %(default)s)")
    cp.add_argument("--tail", type=int, default=0, help="compare only the last N rows of each file")
    cp.add_argument("--head", type=int, default=0,
                    help="then only the first N of those rows (e.g. up to the first indexer tie `run` reports)")
    cp.add_argument("--first-tie", type=int, default=None,
                    help="the first position of an exact top-k tie (the earlier of `ds4run --ties` and "
                         "`run`'s): judge the positions before it only")

    args = ap.parse_args(argv)
    if args.cmd == "run" and args.chunk < 0:
        ap.error("--chunk must be >= 0")
    try:
        return {"make": cmd_make, "run": cmd_run, "teacher": cmd_teacher, "compare": cmd_compare}[args.cmd](args)
    except (CheckError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
