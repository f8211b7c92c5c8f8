"""Build offline stand-ins for the Hub assets TRL's trainer tests load.

Writes (under $WORK, default /tmp/trl_own_tests):
  hf_cache/models--trl-internal-testing--<name>/...  a Hub-cache layout, so that with
      HF_HUB_OFFLINE=1 HF_HUB_CACHE=$WORK/hf_cache every
      `from_pretrained("trl-internal-testing/...")`
      (models, tokenizers, generation configs, also when TRL resolves a string itself) just works;
  hub_datasets/<org>/<name>/<config>/<split>.parquet  TRL's own dataset generator scripts
      (scripts/generate_*_dataset.py from the TRL snapshot) run with push_to_hub redirected here.

Models use the configs of TRL's scripts/generate_tiny_models/*; the tokenizers cannot be
downloaded, so each is a small byte-level BPE trained here, carrying the family's special
tokens and the family's real chat template (taken from the installed trl's chat_templates/).

  python build_assets.py [datasets] [models] [more_models]     (no argument: all three)
"""

import json
import os
import runpy
import sys
from pathlib import Path

import torch
import trl
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from torch import nn
from transformers import GenerationConfig, PreTrainedTokenizerFast

WORK = Path(os.environ.get("WORK", "/tmp/trl_own_tests"))
TRL_SRC = WORK / "trl_src"  # extracted TRL snapshot (scripts/ and tests/)
CACHE = WORK / "hf_cache"
DS_ROOT = WORK / "hub_datasets"
TEMPLATES = Path(trl.__file__).parent / "chat_templates"
FAKE_SHA = "0" * 39 + "1"


# ---------------------------------------------------------------- datasets
def build_datasets():
    import datasets

    def fake_push(self, repo_id, config_name="default", **kwargs):
        dd = (
            self
            if isinstance(self, datasets.DatasetDict)
            else datasets.DatasetDict({"train": self})
        )
        for split, ds in dd.items():
            out = DS_ROOT / repo_id / config_name / f"{split}.parquet"
            out.parent.mkdir(parents=True, exist_ok=True)
            ds.to_parquet(str(out))
        print("saved", repo_id, config_name, {k: len(v) for k, v in dd.items()})

    datasets.DatasetDict.push_to_hub = fake_push
    datasets.Dataset.push_to_hub = fake_push
    for script, repo in [
        ("generate_zen_dataset.py", "trl-internal-testing/zen"),
        ("generate_toolcall_dataset.py", "trl-internal-testing/toolcall"),
        ("generate_harmony_dataset.py", "trl-internal-testing/harmony"),
    ]:
        sys.argv = [script, "--push_to_hub", "True", "--repo_id", repo]
        try:
            runpy.run_path(str(TRL_SRC / "scripts" / script), run_name="__main__")
        except (
            Exception
        ) as e:  # harmony needs extra packages; tests using it then fail for plain TRL too
            print("FAILED", script, type(e).__name__, e)


def corpus():
    texts = []
    for p in DS_ROOT.rglob("*.parquet"):
        import pandas as pd

        df = pd.read_parquet(p)
        texts.extend(json.dumps(r, default=str) for r in df.to_dict("records"))
    texts += ["The quick brown fox jumps over the lazy dog. 0123456789 " * 3]
    return texts


# ---------------------------------------------------------------- tokenizers
def make_tokenizer(
    specials, extra_tokens, chat_template, bos=None, eos=None, pad=None, add_bos=False, vocab=1500
):
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus(), trainer=trainer)
    if add_bos:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, backend.token_to_id(bos))],
        )
    else:
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        model_max_length=131072,
    )
    tok.add_tokens(extra_tokens)  # non-special added tokens (e.g. <tool_call>, <think>)
    tok.chat_template = chat_template
    return tok


QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
QWEN_EXTRA = [
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]
QWEN3_EXTRA = QWEN_EXTRA + ["<tool_response>", "</tool_response>", "<think>", "</think>"]
LLAMA_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
]


def qwen25_tok():
    return make_tokenizer(
        QWEN_SPECIALS,
        QWEN_EXTRA,
        (TEMPLATES / "qwen2_5.jinja").read_text(),
        eos="<|im_end|>",
        pad="<|endoftext|>",
    )


def qwen3_tok():
    return make_tokenizer(
        QWEN_SPECIALS,
        QWEN3_EXTRA,
        (TEMPLATES / "qwen3.jinja").read_text(),
        eos="<|im_end|>",
        pad="<|endoftext|>",
    )


def llama32_tok():
    return make_tokenizer(
        LLAMA_SPECIALS,
        [],
        (TEMPLATES / "llama3_2.jinja").read_text(),
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
        add_bos=True,
    )


# ---------------------------------------------------------------- models
def init_weights_tiny_model(model):  # copy of scripts/generate_tiny_models/_common.py
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv1d)):
            if module.bias is not None:
                nn.init.zeros_(module.bias)
            nn.init.xavier_uniform_(module.weight)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


def save(repo_id, model, tokenizer, gen_kwargs):
    snap = snapshot_dir(repo_id)
    model.save_pretrained(snap)
    tokenizer.save_pretrained(snap)
    if gen_kwargs is not None:
        GenerationConfig(**gen_kwargs).save_pretrained(snap)
    (snap / "README.md").write_text(f"# Tiny {model.__class__.__name__} (offline rebuild)\n")
    print(
        "built",
        repo_id,
        sum(p.numel() for p in model.parameters()),
        "params, vocab",
        len(tokenizer),
    )


def build_models():
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        LlamaForSequenceClassification,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen2ForSequenceClassification,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3ForSequenceClassification,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    torch.manual_seed(0)
    small = dict(
        hidden_size=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=32,
    )
    q = qwen25_tok()
    im_end, eot = q.convert_tokens_to_ids("<|im_end|>"), q.convert_tokens_to_ids("<|endoftext|>")
    qgen = dict(
        bos_token_id=eot,
        pad_token_id=eot,
        do_sample=True,
        eos_token_id=[im_end, eot],
        repetition_penalty=1.05,
        temperature=0.7,
        top_p=0.8,
        top_k=20,
    )
    m = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(q), **small)).to(torch.bfloat16)
    init_weights_tiny_model(m)
    save("trl-internal-testing/tiny-Qwen2ForCausalLM-2.5", m, q, qgen)
    # Qwen2.5-32B-Instruct config (as AutoConfig.from_pretrained gives it) with the
    # script's overrides
    cfg = Qwen2Config(
        vocab_size=len(q),
        num_labels=1,
        bos_token_id=eot,
        eos_token_id=im_end,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        **{**small, "hidden_size": 16},
    )
    m = Qwen2ForSequenceClassification(cfg).to(torch.bfloat16)
    init_weights_tiny_model(m)
    save("trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5", m, q, qgen)

    q3 = qwen3_tok()
    im_end, eot = q3.convert_tokens_to_ids("<|im_end|>"), q3.convert_tokens_to_ids("<|endoftext|>")
    q3gen = dict(
        bos_token_id=eot,
        pad_token_id=eot,
        do_sample=True,
        eos_token_id=[im_end, eot],
        temperature=0.6,
        top_k=20,
        top_p=0.95,
    )
    m = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(q3), **small)).to(torch.bfloat16)
    init_weights_tiny_model(m)
    save("trl-internal-testing/tiny-Qwen3ForCausalLM", m, q3, q3gen)
    cfg = Qwen3Config(
        vocab_size=len(q3),
        num_labels=1,
        bos_token_id=eot,
        eos_token_id=im_end,
        **{**small, "hidden_size": 16},
    )
    m = Qwen3ForSequenceClassification(cfg).to(torch.bfloat16)
    init_weights_tiny_model(m)
    save("trl-internal-testing/tiny-Qwen3ForSequenceClassification", m, q3, q3gen)
    cfg = Qwen3MoeConfig(
        vocab_size=len(q3),
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        norm_topk_prob=True,
        bos_token_id=eot,
        eos_token_id=im_end,
        head_dim=128,
        max_window_layers=48,
        **small,
    )
    m = Qwen3MoeForCausalLM(cfg).to(torch.bfloat16)
    init_weights_tiny_model(m)
    save("trl-internal-testing/tiny-Qwen3MoeForCausalLM", m, q3, q3gen)

    lt = llama32_tok()
    bos = lt.convert_tokens_to_ids("<|begin_of_text|>")
    eos_ids = [lt.convert_tokens_to_ids(t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")]
    lgen = dict(bos_token_id=bos, do_sample=True, eos_token_id=eos_ids, temperature=0.6, top_p=0.9)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=len(lt), **small)).to(torch.bfloat16)
    init_weights_tiny_model(m)
    save("trl-internal-testing/tiny-LlamaForCausalLM-3.2", m, lt, lgen)
    m = LlamaForSequenceClassification(LlamaConfig(vocab_size=len(lt), num_labels=1, **small)).to(
        torch.bfloat16
    )
    init_weights_tiny_model(m)
    save("trl-internal-testing/tiny-LlamaForSequenceClassification-3.2", m, lt, lgen)


def gpt_neox_tok():
    # Pythia's tokenizer: byte-level BPE, <|endoftext|> as BOS and EOS, no pad, no chat template
    return make_tokenizer(
        ["<|endoftext|>", "<|padding|>"], [], None, bos="<|endoftext|>", eos="<|endoftext|>"
    )


def snapshot_dir(repo_id):
    """A fresh snapshot folder of `repo_id` in the Hub-cache layout."""
    repo_dir = CACHE / ("models--" + repo_id.replace("/", "--"))
    snap = repo_dir / "snapshots" / FAKE_SHA
    snap.mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(FAKE_SHA)
    return snap


def build_more_models():
    """Stand-ins the KTO / Reward / RLOO tests also load: the remote-code model (tests of
    `trust_remote_code`), GPT-NeoX (a model without a chat template), GPT-OSS (MoE, harmony
    chat format) and the Qwen3-4B tokenizer whose chat template
    `chat_template_path="Qwen/Qwen3-4B"` clones."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    small = dict(
        hidden_size=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=32,
    )
    # tiny-RemoteForCausalLM: built with TRL's own remote-code classes
    # (scripts/generate_tiny_models/for_causal_lm/_remote_code), registered for the auto
    # classes so that save_pretrained writes the code and the config's auto_map.
    sys.path.insert(0, str(TRL_SRC / "scripts"))
    from generate_tiny_models.for_causal_lm._remote_code.configuration_remote import RemoteConfig
    from generate_tiny_models.for_causal_lm._remote_code.modeling_remote import (
        RemoteForCausalLM,
        RemoteForSequenceClassification,
        RemoteModel,
    )

    RemoteConfig.register_for_auto_class()
    RemoteModel.register_for_auto_class("AutoModel")
    RemoteForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    RemoteForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
    torch.manual_seed(0)
    lt = llama32_tok()
    cfg = RemoteConfig(vocab_size=len(lt), **small)
    cfg.auto_map = {  # as TRL's script does: loadable as AutoModel and as a classifier too
        "AutoModel": "modeling_remote.RemoteModel",
        "AutoModelForSequenceClassification": "modeling_remote.RemoteForSequenceClassification",
    }
    m = RemoteForCausalLM(cfg).to(torch.bfloat16)
    init_weights_tiny_model(m)
    bos = lt.convert_tokens_to_ids("<|begin_of_text|>")
    eos_ids = [lt.convert_tokens_to_ids(t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")]
    lgen = dict(bos_token_id=bos, do_sample=True, eos_token_id=eos_ids, temperature=0.6, top_p=0.9)
    save("trl-internal-testing/tiny-RemoteForCausalLM", m, lt, lgen)

    nt = gpt_neox_tok()
    eot = nt.convert_tokens_to_ids("<|endoftext|>")
    m = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=len(nt), **small)).to(torch.float16)
    init_weights_tiny_model(m)
    save(
        "trl-internal-testing/tiny-GPTNeoXForCausalLM",
        m,
        nt,
        dict(bos_token_id=eot, eos_token_id=eot),
    )

    # tiny-GptOssForCausalLM (MoE): the harmony format's special tokens and TRL's gptoss template
    from transformers import GptOssConfig, GptOssForCausalLM

    specials = [
        "<|startoftext|>",
        "<|endoftext|>",
        "<|return|>",
        "<|constrain|>",
        "<|channel|>",
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|call|>",
    ]
    gt = make_tokenizer(
        specials,
        [],
        (TEMPLATES / "gptoss.jinja").read_text(),
        bos="<|startoftext|>",
        eos="<|return|>",
        pad="<|endoftext|>",
    )
    ids = {s: gt.convert_tokens_to_ids(s) for s in specials}
    cfg = GptOssConfig(vocab_size=len(gt), num_local_experts=4, num_experts_per_tok=2, **small)
    m = GptOssForCausalLM(cfg).to(torch.bfloat16)
    init_weights_tiny_model(m)
    save(
        "trl-internal-testing/tiny-GptOssForCausalLM",
        m,
        gt,
        dict(
            bos_token_id=ids["<|startoftext|>"],
            pad_token_id=ids["<|endoftext|>"],
            eos_token_id=[ids["<|return|>"], ids["<|endoftext|>"], ids["<|call|>"]],
            do_sample=True,
        ),
    )

    # Qwen/Qwen3-4B: its tokenizer is read (a chat template to clone); AutoTokenizer also
    # reads config.json (a tiny Qwen3 config: no weights)
    from transformers import Qwen3Config

    snap = snapshot_dir("Qwen/Qwen3-4B")
    q3 = qwen3_tok()
    q3.save_pretrained(snap)
    Qwen3Config(vocab_size=len(q3), **small).save_pretrained(snap)
    print("built Qwen/Qwen3-4B (tokenizer and config, no weights)")


if __name__ == "__main__":
    # all steps by default; or name some: datasets models more_models
    steps = sys.argv[1:] or ["datasets", "models", "more_models"]
    for step in steps:
        {"datasets": build_datasets, "models": build_models, "more_models": build_more_models}[
            step
        ]()
