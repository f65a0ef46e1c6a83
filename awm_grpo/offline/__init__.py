"""Offline methods on the bundled scenarios beside GRPO: DPO on verifier-labelled trajectory pairs
(`python -m awm_grpo.offline.dpo`) and AgentEvol's explore / filter / fine-tune loop
(`python -m awm_grpo.offline.agentevol`). Both play their episodes through the training rollout
(`awm_grpo.offline.explore`) and save an HF folder that `python -m awm_grpo.eval` evaluates exactly as
it evaluates a GRPO checkpoint."""
