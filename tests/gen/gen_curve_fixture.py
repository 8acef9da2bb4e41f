#!/usr/bin/env python3
"""Reference loss curves for test_train_curve: several AdamW steps in
PyTorch, full fine-tuning and LoRA, on the tiny llama_gqa_tied fixture.

Each case starts from the committed weights (and, for LoRA, from the
PEFT-written adapter tests/fixtures/grad/llama_gqa_tied_lora_adapter), then
takes STEPS steps of torch.optim.AdamW (lr, betas, eps, weight decay as
below, decay off for norms and biases, no clipping) on a fixed batch per
step (B=2, T=9 random tokens, some targets -1), mean loss over trained
targets. The per-step losses (before each update) and the batches go to
tests/fixtures/grad/curve_<case>.safetensors.
Needs torch, transformers, peft (PyPI) only to regenerate.
"""
import os

import torch
from peft import PeftModel
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")
STEPS, B, T = 8, 2, 9
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.999), 1e-8, 0.1


def main():
    torch.use_deterministic_algorithms(True)
    for case in ("full", "lora"):
        g = torch.Generator().manual_seed(77)
        model = AutoModelForCausalLM.from_pretrained(os.path.join(FIX, "hf", "llama_gqa_tied"),
                                                     dtype=torch.float32,
                                                     attn_implementation="eager")
        if case == "lora":
            model = PeftModel.from_pretrained(
                model, os.path.join(FIX, "grad", "llama_gqa_tied_lora_adapter"),
                is_trainable=True)
        V = model.config.vocab_size
        decay, no_decay = [], []
        for n, p in model.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if n.endswith("norm.weight") or n.endswith(".bias") else decay).append(p)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=LR, betas=BETAS, eps=EPS)
        model.train()
        ins, tgs, losses = [], [], []
        for s in range(STEPS):
            x = torch.randint(0, V, (B, T), generator=g)
            y = torch.randint(0, V, (B, T), generator=g)
            y[0, :2] = -1
            logits = model(input_ids=x).logits.float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1),
                                                     ignore_index=-1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            ins.append(x)
            tgs.append(y)
            losses.append(loss.item())
        save_file({"inputs": torch.stack(ins).to(torch.int32).contiguous(),
                   "targets": torch.stack(tgs).to(torch.int32).contiguous(),
                   "losses": torch.tensor(losses, dtype=torch.float64).contiguous(),
                   "hparams": torch.tensor([LR, BETAS[0], BETAS[1], EPS, WD],
                                           dtype=torch.float64)},
                  os.path.join(FIX, "grad", f"curve_{case}.safetensors"))
        print(case, " ".join(f"{l:.5f}" for l in losses))


if __name__ == "__main__":
    main()
