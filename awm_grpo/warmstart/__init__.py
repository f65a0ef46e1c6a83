"""Warm start: supervised fine-tuning on reference solutions, so RL starts above zero reward.

    sft.py             teacher-played episodes through the real rollout, then SFT (`python -m awm_grpo.warmstart`)
    drill.py           synthetic episodes in which copying names is the only way to lower the loss
    counterfactual.py  reference episodes rebuilt with invented names, so names are copied, not memorised
"""
