#!/usr/bin/env python3
"""PyTorch's side of bench/train_vs_torch.sh: one training step (forward,
backward, AdamW) of transformers' LlamaForCausalLM loaded from an energon
model directory (config.json + model.safetensors), float32 on the CPU,
timed like `energon bench train`: random tokens, two warm-up steps, then
the median of --steps timed steps. --lora-rank R wraps the model with PEFT
(rank R, alpha 2R, the targets given, base frozen), as energon's bench does.
Prints one JSON line: tok_per_s and step_ms.

No gradient checkpointing (PyTorch's default), the default attention
(scaled_dot_product_attention), torch.set_num_threads(--threads)."""
import argparse
import json
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lora-rank", type=int, default=0)
    ap.add_argument("--lora-targets",
                    default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32)
    if a.lora_rank:
        from peft import LoraConfig, get_peft_model

        lc = LoraConfig(r=a.lora_rank, lora_alpha=2 * a.lora_rank, lora_dropout=0.0,
                        target_modules=a.lora_targets.split(","), bias="none")
        model = get_peft_model(model, lc)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(99)
    ids = torch.randint(0, V, (a.batch, a.seq_len), generator=g)
    tgt = torch.randint(0, V, (a.batch, a.seq_len), generator=g)
    times = []
    for s in range(a.steps + 2):  # two warm-up steps
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, V), tgt.view(-1))
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        if s >= 2:
            times.append(dt)
    med = statistics.median(times)
    print(json.dumps({"bench": "torch_train", "batch": a.batch, "seq_len": a.seq_len,
                      "threads": torch.get_num_threads(), "lora_rank": a.lora_rank,
                      "trainable": sum(p.numel() for p in params),
                      "tok_per_s": a.batch * a.seq_len / med, "step_ms": med * 1e3,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
