"""BFCL evaluation: `chat_server` (OpenAI chat in front of our engines, project venv) and `harness`
(bfcl-eval's own generation and checker, run by path in the BFCL venv). Entry point: awm_grpo.eval_bfcl."""
