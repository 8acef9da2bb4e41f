#!/usr/bin/env python3
"""Gradient references for the model-family fixtures of tests/fixtures/hf
(made by gen_family_fixtures.py, which must run first): PyTorch autograd on
the tiny Llama-3-rope, Llama linear-rope/head_dim/bias, Qwen2 sliding-window,
Qwen3, Gemma 2, Gemma 3, Phi-3 and GPT-2 models.

Same method and format as gen_grad_fixtures.py: for each case a fixed batch
(B=2 sequences of T=9 tokens, some targets ignored with -1) goes through the
model in float32 with eager attention; the loss is the mean negative
log-likelihood over the trained targets; loss.backward() gives the gradient of
every trainable parameter. Written to tests/fixtures/grad/<case>.safetensors:
  "inputs" I32 (B, T), "targets" I32 (B, T), "loss" F32 (1), and one F32
  tensor per trainable parameter named "grad.<HF or PEFT name>" (a tied
  lm_head has no entry of its own: its gradient is in the embedding's).
LoRA cases use PEFT (rank 4, alpha 8, dropout 0, every linear layer of the
blocks: q/k/v/o/gate/up/down; Phi-3 qkv_proj/o_proj/gate_up_proj/down_proj;
GPT-2 c_attn/c_proj/c_fc, which are Conv1D, so fan_in_fan_out=true) with
lora_B made non-zero so that lora_A gets a gradient; the adapter is saved next
to the gradients with PEFT's own save_pretrained
(tests/fixtures/grad/<case>_adapter/: adapter_config.json with
target_modules sorted and base_model_name_or_path set to the fixture, and
adapter_model.safetensors).

Input ids never equal the embedding's padding_idx (Gemma's pad_token_id 0):
nn.Embedding(padding_idx=p) gives row p no gradient from the lookup, an HF
detail the C trainer need not copy.

Versions and per-case figures go to tests/fixtures/grad/VERSIONS_families.txt.
Needs torch, transformers, peft, safetensors (PyPI) only to regenerate:
    python3 tests/gen/gen_family_fixtures.py
    python3 tests/gen/gen_family_grad_fixtures.py [fixtures_dir]
fixtures_dir (default tests/fixtures) holds hf/<model>/ and receives grad/.
"""
import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")
B, T = 2, 9
SEED = 2345

LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TARGETS = {
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
    "gpt2": ["c_attn", "c_proj", "c_fc"],
}

CASES = [
    # (case, model fixture, lora?)
    ("llama3_rope_full", "llama3_rope", False),
    ("llama_linear_hd_full", "llama_linear_hd", False),
    ("llama_linear_hd_lora", "llama_linear_hd", True),
    ("qwen2_swa_full", "qwen2_swa", False),
    ("qwen3_full", "qwen3", False),
    ("qwen3_lora", "qwen3", True),
    ("gemma2_full", "gemma2", False),
    ("gemma2_lora", "gemma2", True),
    ("gemma3_full", "gemma3", False),
    ("phi3_full", "phi3", False),
    ("phi3_lora", "phi3", True),
    ("gpt2_full", "gpt2", False),
    ("gpt2_lora", "gpt2", True),
]


def loss_of(model, inputs, targets, V):
    logits = model(input_ids=inputs).logits.float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1),
                                             ignore_index=-1, reduction="mean")


def make_case(i, case, fx, lora, fix, out):
    torch.manual_seed(SEED + i)   # PEFT's lora_A init uses the global generator
    g = torch.Generator().manual_seed(100 + i)
    model = AutoModelForCausalLM.from_pretrained(os.path.join(fix, "hf", fx),
                                                 dtype=torch.float32,
                                                 attn_implementation="eager")
    V = model.config.vocab_size
    inputs = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)
    targets[0, :3] = -1   # an ignored prompt
    targets[1, 5] = -1
    pad = model.get_input_embeddings().padding_idx
    n_pad = 0
    if pad is not None:
        n_pad = int((inputs == pad).sum())
        inputs[inputs == pad] = (pad + 1) % V
    note = f"{case}: model {fx} ({type(model).__name__})"
    if pad is not None:
        note += f", embedding padding_idx {pad} ({n_pad} input ids moved off it)"
    if lora:
        from peft import LoraConfig, get_peft_model
        mt = model.config.model_type
        targets_m = TARGETS.get(mt, LLAMA_TARGETS)
        cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, bias="none",
                         target_modules=targets_m, fan_in_fan_out=(mt == "gpt2"),
                         task_type="CAUSAL_LM")
        model = get_peft_model(model, cfg)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        adir = os.path.join(out, case + "_adapter")
        if os.path.isdir(adir):
            shutil.rmtree(adir)
        model.save_pretrained(adir)
        for f in os.listdir(adir):
            if f not in ("adapter_config.json", "adapter_model.safetensors"):
                os.remove(os.path.join(adir, f))
        # no machine paths in committed files; target_modules is a set in PEFT,
        # sorted here so that the file does not depend on the hash seed
        cp = os.path.join(adir, "adapter_config.json")
        with open(cp) as fh:
            ac = json.load(fh)
        ac["base_model_name_or_path"] = "tests/fixtures/hf/" + fx
        ac["target_modules"] = sorted(ac["target_modules"])
        with open(cp, "w") as fh:
            json.dump(ac, fh, indent=2, sort_keys=True)
        note += f", LoRA r 4 alpha 8 on {sorted(targets_m)}"
        if mt == "gpt2":
            note += " (fan_in_fan_out true)"
    # no dropout anywhere: the training-mode loss equals the eval-mode loss
    model.eval()
    with torch.no_grad():
        loss_eval = loss_of(model, inputs, targets, V)
    model.train()
    loss = loss_of(model, inputs, targets, V)
    assert torch.equal(loss.detach(), loss_eval), (case, loss.item(), loss_eval.item())
    loss.backward()
    tensors = {"inputs": inputs.to(torch.int32).contiguous(),
               "targets": targets.to(torch.int32).contiguous(),
               "loss": loss.detach().reshape(1).contiguous()}
    seen = set()
    gmax = 0.0
    for n, p in model.named_parameters():
        if not p.requires_grad or p.grad is None:
            assert not p.requires_grad or lora, (case, n)
            continue
        if p.data_ptr() in seen:   # tied lm_head: one gradient for both
            continue
        seen.add(p.data_ptr())
        name = n.replace(".default", "") if lora else n
        assert float(p.grad.abs().max()) > 0, (case, name)
        gmax = max(gmax, float(p.grad.abs().max()))
        tensors["grad." + name] = p.grad.detach().contiguous()
    path = os.path.join(out, case + ".safetensors")
    save_file(tensors, path)
    n_tok = int((targets >= 0).sum())
    note += (f"; loss {loss.item():.7f} over {n_tok} targets, {len(tensors) - 3} gradients "
             f"(max |g| {gmax:.4g}), {os.path.getsize(path)} bytes")
    return note


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    fix = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else FIX)
    out = os.path.join(fix, "grad")
    os.makedirs(out, exist_ok=True)
    notes = []
    for i, (case, fx, lora) in enumerate(CASES):
        notes.append(make_case(i, case, fx, lora, fix, out))
        print(notes[-1])
    import peft
    import safetensors
    with open(os.path.join(out, "VERSIONS_families.txt"), "w") as f:
        f.write("Generated by tests/gen/gen_family_grad_fixtures.py (models from "
                "tests/gen/gen_family_fixtures.py)\n")
        f.write(f"python {sys.version.split()[0]}\ntorch {torch.__version__}\n"
                f"transformers {transformers.__version__}\npeft {peft.__version__}\n"
                f"safetensors {safetensors.__version__}\n")
        f.write(f"B={B} T={T}; targets[0,:3] and targets[1,5] are -1; loss = mean NLL over "
                f"the trained targets. phi3: T=9 <= original_max_position_embeddings 16, so "
                f"these use the short factors.\n")
        for n in notes:
            f.write(n + "\n")


if __name__ == "__main__":
    main()
